"""The agent's side of `NetworkLoadTest` (docs/loadtest.md): take this node's plans, run their
flows, echo probes and storage reads at the plan's times, publish one result per plan."""
