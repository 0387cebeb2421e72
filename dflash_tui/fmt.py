"""Small text formatters shared by the headless view and the TUI."""

from __future__ import annotations

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


def rate(tok_s: Any) -> str:
    if not isinstance(tok_s, int | float):
        return "? tok/s"
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
