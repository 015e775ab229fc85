"""Per-node MQTT identity: agents enroll with their pod-bound ServiceAccount token, the
operator issues each node its own Mosquitto dynamic-security client (docs/operations.md,
"Per-node MQTT identity")."""
