"""East-west probes: peer selection, the responder peers probe, echo/loss/path-MTU and
throughput probes, and the service that ties them to MQTT and the probe cycle."""
