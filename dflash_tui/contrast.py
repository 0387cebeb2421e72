"""WCAG 2.x contrast: relative luminance of sRGB colours and the ratio between two.

AA asks >= 4.5:1 for text (and here for plot lines and bars, which carry the same
information) and >= 3:1 for non-text UI such as borders. Stdlib only: the theme check runs
on the theme files alone, and the rendered check on the colours Textual composited.
"""

from __future__ import annotations

TEXT_AA = 4.5
UI_AA = 3.0
# A theme's colours that carry text, and what they are drawn on (Textual's theme names).
TEXT_COLOURS = ("foreground", "primary", "secondary", "accent", "success", "warning", "error")
BACKGROUNDS = ("background", "surface", "panel")

RGB = tuple[int, int, int]


def parse_hex(value: str) -> RGB:
    """`#rrggbb` or `#rgb` as a triplet; anything else is a ValueError naming it."""
    v = value.strip().lstrip("#")
    if len(v) == 3:
        v = "".join(c * 2 for c in v)
    if len(v) != 6:
        raise ValueError(f"not a #rrggbb colour: {value!r}")
    return int(v[0:2], 16), int(v[2:4], 16), int(v[4:6], 16)


def _channel(c: int) -> float:
    s = c / 255
    return s / 12.92 if s <= 0.04045 else ((s + 0.055) / 1.055) ** 2.4


def luminance(rgb: RGB) -> float:
    r, g, b = (_channel(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def ratio(a: RGB, b: RGB) -> float:
    """(lighter + 0.05) / (darker + 0.05): 1.0 for equal colours, 21.0 for black on white."""
    la, lb = luminance(a), luminance(b)
    hi, lo = max(la, lb), min(la, lb)
    return (hi + 0.05) / (lo + 0.05)


def blend(fg: RGB, bg: RGB, alpha: float) -> RGB:
    """`fg` at `alpha` over `bg`, as a CSS `$primary 40%` is drawn."""
    return tuple(round(f * alpha + b * (1 - alpha)) for f, b in zip(fg, bg, strict=True))  # type: ignore[return-value]


def text_failures(colours: dict[str, RGB]) -> list[str]:
    """`primary on panel: 3.0:1` for each text colour below TEXT_AA on a background; a
    colour the theme lacks is `missing`."""
    out = []
    for fg in TEXT_COLOURS:
        for bg in BACKGROUNDS:
            if fg not in colours or bg not in colours:
                out.append(f"{fg} on {bg}: missing")
                continue
            r = ratio(colours[fg], colours[bg])
            if r < TEXT_AA:
                out.append(f"{fg} on {bg}: {r:.1f}:1")
    return out
