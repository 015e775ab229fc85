"""Formatting shared by the HTML report's sections: escaping, times, units and colours.

- Every string taken from the object is escaped with `html.escape` (:func:`escape`): names,
  reasons, messages, domains and check ids come from users, node labels and agents.
- Colours are computed here; text colour is black or white, whichever contrasts more with the
  cell (WCAG contrast ratio), so a coloured cell always stays readable.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Final

Rgb = tuple[int, int, int]

# Sequential scales, light to dark (ColorBrewer YlOrRd and Blues, colour-blind safe).
LATENCY_SCALE: Final[tuple[Rgb, ...]] = (
    (255, 255, 204),
    (254, 217, 118),
    (253, 141, 60),
    (227, 26, 28),
    (128, 0, 38),
)
THROUGHPUT_SCALE: Final[tuple[Rgb, ...]] = (
    (247, 251, 255),
    (198, 219, 239),
    (107, 174, 214),
    (33, 113, 181),
    (8, 48, 107),
)
LATENCY_OCTAVES: Final = 4  # the latency scale spans 1x .. 2**4 = 16x the intra-domain median
LEGEND_STEPS: Final = 5


def escape(value: object) -> str:
    return html.escape(str(value), quote=True)


def iso_time(when: datetime | None) -> str:
    if when is None:
        return "never"
    return when.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def relative(when: datetime, now: datetime) -> str:
    """ "12 s ago", "7 min ago", "3 h ago", "2 d ago" ("in ..." for a time after now)."""
    seconds = int((now - when).total_seconds())
    future, seconds = seconds < 0, abs(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            text = f"{seconds // size} {unit}"
            break
    else:
        text = f"{seconds} s"
    return f"in {text}" if future else f"{text} ago"


def when_html(when: datetime | None, now: datetime) -> str:
    """A relative time with the absolute UTC one on hover (and machine-readable)."""
    if when is None:
        return "never"
    iso = iso_time(when)
    return f'<time datetime="{iso}" title="{iso}">{escape(relative(when, now))}</time>'


# -- units ----------------------------------------------------------------------------------------


def fmt_latency(ms: float | None) -> str:
    """A latency as people read it: 12 µs, 250 µs, 1.25 ms, 14.2 ms."""
    if ms is None:
        return "-"
    if ms < 1:
        us = ms * 1000
        return f"{us:.1f} µs" if us < 10 else f"{us:.0f} µs"
    return f"{ms:.2f} ms" if ms < 10 else f"{ms:.1f} ms"


def fmt_rate(mbps: float | None) -> str:
    """A throughput as people read it: 940 Mbit/s, 377.1 Gbit/s."""
    if mbps is None:
        return "-"
    if mbps >= 1000:
        gbps = mbps / 1000
        return f"{gbps:.1f} Gbit/s" if gbps < 100 else f"{gbps:.0f} Gbit/s"
    return f"{mbps:.1f} Mbit/s" if mbps < 10 else f"{mbps:.0f} Mbit/s"


# -- colours ------------------------------------------------------------------------------------


def scale_colour(t: float, scale: Sequence[Rgb]) -> Rgb:
    """Linear interpolation along `scale` for t in [0, 1] (clipped)."""
    t = min(1.0, max(0.0, t))
    pos = t * (len(scale) - 1)
    i = min(int(pos), len(scale) - 2)
    frac = pos - i
    lo, hi = scale[i], scale[i + 1]
    r, g, b = (round(lo[k] + (hi[k] - lo[k]) * frac) for k in range(3))
    return (r, g, b)


def _luminance(rgb: Rgb) -> float:
    """WCAG 2 relative luminance."""

    def channel(c: int) -> float:
        s = c / 255
        return s / 12.92 if s <= 0.03928 else ((s + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def text_colour(background: Rgb) -> str:
    """Black or white, whichever contrasts more with `background` (WCAG contrast ratio)."""
    lum = _luminance(background)
    on_black = (lum + 0.05) / 0.05
    on_white = 1.05 / (lum + 0.05)
    return "#000000" if on_black >= on_white else "#ffffff"


def cell_style(rgb: Rgb) -> str:
    return f"background:#{rgb[0]:02x}{rgb[1]:02x}{rgb[2]:02x};color:{text_colour(rgb)}"


def latency_position(p50: float, reference: float) -> float:
    """Where a latency sits on the log2 scale: 0 at (or below) the reference (the intra-domain
    median), 1 at 2**LATENCY_OCTAVES times it; 0.012 ms and 0.036 ms are 0.4 apart."""
    if reference <= 0 or p50 <= reference:
        return 0.0
    return min(1.0, math.log2(p50 / reference) / LATENCY_OCTAVES)


def legend(label: str, scale: Sequence[Rgb], ticks: Sequence[str], note: str = "") -> str:
    steps = len(ticks)
    swatches = "".join(
        f'<span style="{cell_style(scale_colour(i / (steps - 1), scale))}">{escape(tick)}</span>'
        for i, tick in enumerate(ticks)
    )
    extra = f"<span>{escape(note)}</span>" if note else ""
    return f'<div class="legend" role="note"><span>{escape(label)}</span>{swatches}{extra}</div>'
