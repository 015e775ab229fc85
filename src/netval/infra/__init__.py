"""Shared process infrastructure: MQTT settings and client, the metrics HTTP server, telemetry, task stopping, YAML input."""
