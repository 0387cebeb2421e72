"""Theme colours where Textual's CSS does not reach: plot lines and bars (plotext takes RGB
triplets), rich styles built in the panes, and the ANSI colour names (`red`, `green`, …)
the panes use, which are mapped onto the theme so that every one of them follows it.

Without the mapping Textual draws the names from its own fixed palettes (MONOKAI on a
dark theme, ALABASTER on a light one), whatever the theme: cyan on the light theme's
surface was 1.2:1. The themes' colours are chosen to meet WCAG AA against the theme's
backgrounds (tests/monitor/test_contrast.py), so the names do too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.terminal_theme import TerminalTheme
from textual.app import App
from textual.color import Color, ColorParseError
from textual.theme import Theme

from dflash_tui import contrast

# The order series take their colour in: the first plot line of a panel is primary.
SERIES = ("primary", "accent", "success", "secondary", "warning", "error")


def hex_of(app: App[Any], name: str) -> str:
    """The theme's colour `name` as `#rrggbb` (its foreground when the theme leaves it out)."""
    theme = app.current_theme
    value = getattr(theme, name, None) or theme.foreground or "#ffffff"
    return Color.parse(value).hex


def rgb(app: App[Any], name: str) -> tuple[int, int, int]:
    return Color.parse(hex_of(app, name)).rgb


def series_rgb(app: App[Any], index: int) -> tuple[int, int, int]:
    return rgb(app, SERIES[index % len(SERIES)])


def terminal_theme(app: App[Any]) -> TerminalTheme:
    """The ANSI colours as the theme's: red is its error, green success, yellow warning,
    blue primary, magenta secondary, cyan accent, white the foreground."""
    names = (
        "background",
        "error",
        "success",
        "warning",
        "primary",
        "secondary",
        "accent",
        "foreground",
    )
    normal = [rgb(app, n) for n in names]
    return TerminalTheme(rgb(app, "background"), rgb(app, "foreground"), normal, normal)


def follow_theme(app: App[Any], redraw: Callable[[], None]) -> None:
    """Map the ANSI names onto the app's theme now and at every theme change, then
    `redraw`: colours built into renderables (plot lines, bars) are the old theme's."""

    def apply(_theme: object = None) -> None:
        mapped = terminal_theme(app)
        app.ansi_theme_dark = mapped
        app.ansi_theme_light = mapped

    def changed(theme: object) -> None:
        apply()
        redraw()

    apply()
    app.theme_changed_signal.subscribe(app, changed)


def aa_failures(theme: Theme) -> list[str]:
    """Where `theme`'s text falls below WCAG AA, with Textual's own derivation of the colours
    it leaves out (a surface from its background, …); [] when it passes."""
    resolved = theme.to_color_system().generate()
    colours: dict[str, contrast.RGB] = {}
    for name in (*contrast.TEXT_COLOURS, *contrast.BACKGROUNDS):
        try:
            colour = Color.parse(resolved[name])
        except (KeyError, ColorParseError):
            continue  # ansi_default and the like: no fixed colour, so no contrast to promise
        colours[name] = colour.rgb
    return contrast.text_failures(colours)


def keep_aa_themes(app: App[Any]) -> dict[str, list[str]]:
    """Unregister every theme below WCAG AA (Textual's own, some at 1.9:1, and any user
    theme), so that neither the command palette nor `t` offers it; {name: why} of those
    left out."""
    dropped = {}
    for name, theme in list(app.available_themes.items()):
        failures = aa_failures(theme)
        if failures:
            app.unregister_theme(name)
            dropped[name] = failures
    return dropped
