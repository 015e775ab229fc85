"""The node side: collectors (live host, recorded snapshot), pure checks, runner."""
