"""Node gating: pure decisions (labels, taints, breaker) and the writer that applies them."""
