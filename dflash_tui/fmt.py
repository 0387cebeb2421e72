"""Small text formatters shared by the headless view and the TUI."""

from __future__ import annotations

import math
from typing import Any

BARS = "▁▂▃▄▅▆▇█"


def duration(seconds: float | None, minutes: bool = False) -> str:
    """`minutes`: to the minute (`<1m`, `7m`, `2h05m`), for an ended run's ages: a figure
    that moves every second repaints its pane every second, and after the end the second
    says nothing."""
    if seconds is None:
        return "?"
    if minutes and seconds < 3600:
        return "<1m" if seconds < 60 else f"{int(seconds // 60)}m"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


# Figures from the host are untrusted: JSON allows 1e308 and a 400-digit integer, and
# Python's JSON reader NaN. Printed as they are, one pushed every later field off the line.
PLAUSIBLE_MAX = 1e12  # no step count, token rate or queue depth of a real run comes near it
IMPLAUSIBLE = "(implausible)"


def implausible(value: Any, limit: float = PLAUSIBLE_MAX, negative: bool = False) -> str | None:
    """None for a figure a run can write: a finite number within `limit` (and not negative
    unless `negative`); else what to show instead, bounded and labelled (`>1e12
    (implausible)`, `NaN (implausible)`, `-3e+05 (implausible)`, `? (not a number)`)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "? (not a number)"
    if isinstance(value, float) and math.isnan(value):
        return f"NaN {IMPLAUSIBLE}"
    if value > limit:
        return f">{limit:.0e} {IMPLAUSIBLE}".replace("e+", "e")
    if value < -limit:
        return f"<-{limit:.0e} {IMPLAUSIBLE}".replace("e+", "e")
    if value < 0 and not negative:
        return f"{float(value):.3g} {IMPLAUSIBLE}"
    return None


def count(n: Any, limit: float = PLAUSIBLE_MAX, sep: str = "") -> str:
    """A whole count from the host (a step, a queue depth), bounded and labelled; `sep` ","
    groups its thousands."""
    bad = implausible(n, limit)
    if bad is not None:
        return bad
    return f"{n:{sep}.0f}" if isinstance(n, float) else f"{n:{sep}d}"


def real(x: Any, digits: int = 3) -> str:
    """A measured real (a loss, a norm) in a bounded width: fixed point while it is short,
    else scientific; NaN and infinities as such (a diverged loss is news, not noise)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return "? (not a number)"
    if not isinstance(x, float) and abs(x) >= 1e300:  # an int too large for a float
        x = math.inf if x > 0 else -math.inf
    x = float(x)
    if not math.isfinite(x):
        return str(x)
    return f"{x:.{digits}f}" if abs(x) < 1e6 else f"{x:.{digits}e}"


def rate(tok_s: Any) -> str:
    if isinstance(tok_s, bool) or not isinstance(tok_s, int | float):
        return "? tok/s"
    bad = implausible(tok_s)
    if bad is not None:
        return f"{bad} tok/s"
    return f"{tok_s / 1e3:.1f}K tok/s" if tok_s >= 1000 else f"{tok_s:.0f} tok/s"


def size(n: float) -> str:
    """Bytes in binary units, as the memory figures are said: 5.2 MB, 41.0 GB, 12 KB."""
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GB"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MB"
    return f"{n / 1024:.0f} KB"


def spark(values: list[float], width: int, top: float | None = None) -> str:
    """The last `width` values as block characters, scaled to `top` (or their max)."""
    values = values[-width:]
    if not values:
        return ""
    peak = top if top else max(values) or 1.0
    return "".join(BARS[min(7, max(0, int(v / peak * 7.999)))] for v in values)


def bar(fraction: float, width: int) -> str:
    """A horizontal bar of `width` cells, eighths resolution."""
    fraction = min(1.0, max(0.0, fraction))
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    partial = " ▏▎▍▌▋▊▉"[part] if part else ""
    return ("█" * full + partial).ljust(width)
