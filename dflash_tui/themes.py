"""Themes: `themes/*.tcss` files of colour variables, and the remembered choice.

A theme file declares `$name: value;` lines for Textual's theme colours (primary,
secondary, accent, foreground, background, surface, panel, success, warning, error) and
`$dark: true|false`. The app's stylesheet uses only those variables, so a theme file is
all it takes to restyle every pane. The choice is remembered in the XDG config folder.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

BUNDLED = Path(__file__).resolve().parents[1] / "themes"
DEFAULT_THEME = "dark"
_DECL = re.compile(r"^\s*\$([a-z-]+)\s*:\s*([^;]+);", re.MULTILINE)
_COLOURS = (
    "primary",
    "secondary",
    "accent",
    "foreground",
    "background",
    "surface",
    "panel",
    "success",
    "warning",
    "error",
)


class ThemeError(ValueError):
    pass


@dataclass(frozen=True)
class ThemeSpec:
    name: str
    colours: dict[str, str]
    dark: bool
    path: Path


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(base) / "dflash-tui"


def theme_dirs() -> list[Path]:
    return [BUNDLED, config_dir() / "themes"]


def parse_theme(path: Path) -> ThemeSpec:
    text = re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.DOTALL)
    decls = {k: v.strip() for k, v in _DECL.findall(text)}
    unknown = set(decls) - set(_COLOURS) - {"dark"}
    if unknown:
        raise ThemeError(f"{path}: unknown variables {sorted(unknown)}")
    if "primary" not in decls:
        raise ThemeError(f"{path}: needs at least $primary")
    return ThemeSpec(
        name=path.stem,
        colours={k: v for k, v in decls.items() if k in _COLOURS},
        dark=decls.get("dark", "true").lower() != "false",
        path=path,
    )


def available_themes() -> dict[str, ThemeSpec]:
    found: dict[str, ThemeSpec] = {}
    for folder in theme_dirs():
        for path in sorted(folder.glob("*.tcss")):
            found[path.stem] = parse_theme(path)  # a user's file overrides a bundled one
    return found


def settings_path() -> Path:
    return config_dir() / "settings.json"


def remembered_theme() -> str | None:
    try:
        data = json.loads(settings_path().read_text())
    except (OSError, ValueError):
        return None
    theme = data.get("theme") if isinstance(data, dict) else None
    return theme if isinstance(theme, str) else None


def remember_theme(name: str) -> None:
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            data = {}
    except (OSError, ValueError):
        data = {}
    data["theme"] = name
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".settings.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)  # atomic: a crash never leaves half a settings file


def starting_theme(asked: str | None, saved: object, specs: dict[str, ThemeSpec]) -> str:
    """The theme the TUI starts in: --theme, else the named target's (`saved`, from the user
    config), else the one remembered, else the default; one not among `specs` falls back to
    the default (or any there is, or Textual's own)."""
    wanted = (
        asked or (saved if isinstance(saved, str) else None) or remembered_theme() or DEFAULT_THEME
    )
    if wanted in specs:
        return wanted
    return DEFAULT_THEME if DEFAULT_THEME in specs else next(iter(specs), "textual-dark")
