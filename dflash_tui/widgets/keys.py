"""Keys by mode: which keys act where, in one table (issue 32, "keys by mode").

Three modes, as in less, k9s and lazygit, where a viewer's keys never act on the world:

- the dashboard (the app's first screen): the run controls (restart, kill, stacks, clear
  cache, …) and the view keys below. Only here, and in the command palette (ctrl+p, which
  calls the actions by name from anywhere: a deliberate choice, never a stray key);
- a viewer (stacks, run info, the log viewer, threads, replay, compare, help): reads, never
  sends. `/` searches, `n` / `N` go to the next / previous match, `q` / Esc close;
- a dialog that kills, clears or signals: it confirms only on a typed word and Enter
  (dialogs.py), so a stray letter never confirms.

The app's bindings are `DASHBOARD`; `DFlashApp.check_action` turns every one of them but help
and quit off while any other screen is on top (Textual offers a key to the app after the screen on
top, so without that an `r` typed in a viewer reached restart).
"""

from __future__ import annotations

from textual.binding import Binding, BindingType

# Help and quit first: at 80 columns the footer shows the first few only. Kill is K (shift):
# k scrolls up, as j k g G do everywhere a list scrolls (widgets/panes.py).
DASHBOARD: list[BindingType] = [
    Binding("question_mark", "help", "help"),
    Binding("q", "quit", "quit"),
    Binding("r", "restart", "restart"),
    Binding("K", "kill", "kill"),
    Binding("d", "dump_stacks", "stacks"),
    Binding("c", "clear_cache", "clear cache"),
    Binding("l,enter", "runs", "runs"),
    Binding("slash", "filter", "filter"),
    Binding("f", "follow", "follow"),
    Binding("w", "wrap", "wrap"),
    Binding("C", "clock", "clock", show=False),
    Binding("o", "pager", "pager"),
    Binding("v", "log_viewer", "log viewer", show=False),
    Binding("z", "zoom", "zoom"),
    Binding("p", "replay", "replay"),
    Binding("t", "next_theme", "theme"),
    Binding("T", "threads", "threads"),
    Binding("P", "gpu_processes", "GPU processes", show=False),
    Binding("i", "run_info", "run info", show=False),
    Binding("g", "log_top", "top of log", show=False),
]

# Actions that send a request to the agent about the run (or change what is followed).
RUN_CONTROLS = frozenset({"restart", "kill", "dump_stacks", "clear_cache", "runs"})

# Everywhere: the help is a viewer itself and sends nothing; quit leaves the run alone, and
# a screen may bind its own key to it (the fleet's q). Every viewer binds q to close first.
EVERYWHERE = frozenset({"help", "quit"})

# The app's actions that act only while the dashboard is the screen on top.
DASHBOARD_ONLY = frozenset(b.action for b in DASHBOARD if isinstance(b, Binding)) - EVERYWHERE

# A viewer's own keys (search.py answers them): search, next / previous match, close.
VIEWER: list[BindingType] = [
    Binding("slash", "search", "search"),
    Binding("n", "next_match", "next match"),
    Binding("N", "previous_match", "previous match"),
    Binding("escape,q", "close", "back"),
]


def dashboard_only(action: str) -> bool:
    """Whether the app's `action` is one that acts on the dashboard only."""
    return action in DASHBOARD_ONLY
