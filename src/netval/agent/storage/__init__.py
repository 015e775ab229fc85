"""Storage probes: one protocol-aware exchange per endpoint, throughput, and their verdicts."""
