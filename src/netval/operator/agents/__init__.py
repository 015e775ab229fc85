"""What the operator deploys for the agents: their ConfigMap and DaemonSet per validation."""
