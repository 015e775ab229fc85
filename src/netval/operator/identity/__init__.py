"""Per-node MQTT identity: agents enroll with their pod-bound ServiceAccount token and a
certificate signing request; the identity CA signs a client certificate naming
`<validation>/<node>`, which brokers map to the user name of a per-node ACL pattern
(docs/architecture.md "Broker identity")."""
