"""Themes: `themes/*.tcss` files of colour variables, and the remembered choice.

A theme file declares `$name: value;` lines for Textual's theme colours (primary,
secondary, accent, foreground, background, surface, panel, success, warning, error) and
`$dark: true|false`. The app's stylesheet uses only those variables, so a theme file is
all it takes to restyle every pane. The choice is remembered in the XDG config folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.contract.textfile import TextFileError, read_text_file

BUNDLED = Path(__file__).resolve().parents[1] / "themes"
DEFAULT_THEME = "dark"
MAX_THEME_BYTES = 64 << 10  # ten colour lines; anything this big is not a theme
MAX_SETTINGS_BYTES = 64 << 10
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
    try:  # a user's file: regular, bounded, UTF-8 (a FIFO named x.tcss would block the start)
        text = read_text_file(path, f"theme {path}", MAX_THEME_BYTES)
    except TextFileError as e:
        raise ThemeError(str(e)) from None
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL)
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


def _settings() -> dict[str, Any]:
    """settings.json, or {} when it is not a readable JSON object (a preference: never worth
    refusing a start for; read bounded, regular files only, so a FIFO there never blocks)."""
    try:
        data = json.loads(read_text_file(settings_path(), "settings", MAX_SETTINGS_BYTES))
    except (TextFileError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def remembered_theme() -> str | None:
    theme = _settings().get("theme")
    return theme if isinstance(theme, str) else None


def remember_theme(name: str) -> str | None:
    """None once remembered, else why not, in one line (a folder named settings.json, a
    read-only config folder): the theme still changes, only not for the next start."""
    path = settings_path()
    data = {**_settings(), "theme": name}
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".settings.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)  # atomic: a crash never leaves half a settings file
    except OSError as e:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return f"theme not remembered: {path}: {e.strerror or e}"
    return None


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
