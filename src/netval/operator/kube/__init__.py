"""The Kubernetes API: the operator's reads and writes, and the webhook TLS certificates."""
