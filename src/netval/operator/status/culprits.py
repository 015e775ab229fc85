"""The Event that names a localized culprit (pure): the first suspect of `status.eastWest`,
a link before a node (a link explains more paths), as a key and a sentence.

The status writer posts `CulpritLocalized` (Warning) when the first culprit changes to
another one, not when it goes away (the status says that), so a fault that holds costs one
Event, however many windows it spans: at 10,000 nodes still one Event per change per
validation.
"""

from __future__ import annotations

from netval.model.east_west import EastWest, LinkKind


def culprit(ew: EastWest | None) -> tuple[str, str] | None:
    """(key, message) of the first suspect, or None when there is none."""
    if ew is None:
        return None
    watching = f"; {ew.observers} observing node(s) not degraded for it" if ew.observers else ""
    if ew.link_suspects:
        s = ew.link_suspects[0]
        what = (
            f"the uplink of {s.a}"
            if s.kind is LinkKind.UPLINK
            else f"the fabric between {s.a} and {s.b}"
        )
        key = f"link:{s.kind.value}:{s.a}:{s.b or ''}"
        message = (
            f"{what} is the suspect: {s.failing_paths} of {s.paths} node pairs through it fail "
            f"({', '.join(s.checks)}), {s.failing_around} of {s.paths_around} around it "
            f"(confidence {s.confidence:.2f}){watching}"
        )
        return key, message[:1024]
    if ew.suspects:
        n = ew.suspects[0]
        message = (
            f"node {n.node} ({n.domain}) is the suspect: {n.failing_peers} of {n.peers} peers "
            f"fail paths to it ({', '.join(n.checks)}) while they pass with others "
            f"(confidence {n.confidence:.2f}){watching}"
        )
        return f"node:{n.node}", message[:1024]
    return None


__all__ = ["culprit"]
