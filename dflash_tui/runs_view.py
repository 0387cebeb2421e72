"""The runs list as both views show it (the TUI's runs screen, `dflash-tui runs`): the step a
run reached, a filter and a sort (as k9s and lazygit have on every list), and which columns
fit a width, in their priority order.

Pure Python: no textual. Every string in a run is the host's; the views show the cells
through sanitize (the CLI) or widgets/safe.py (the TUI).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dflash_tui.evaluation import best_tau
from dflash_tui.facts import run_outcome
from dflash_tui.fmt import count, implausible
from trainer.contract.outcomes import OUTCOMES
from trainer.contract.protocol import RunInfo


class RunsViewError(ValueError):
    """A sort key or a filter that means nothing, said in one line."""


def shown_steps(r: RunInfo) -> int:
    """The step the run reached, as its outcome says it ("stopped at step 51"): the exit
    record's, else the heartbeat's. `RunInfo.steps` is the last metrics row's step, which
    lags by up to a logging period (50 against 51); it is the answer only without either."""
    step = run_outcome(r).step
    if step is None:
        step = r.step
    return max(step, r.steps) if step is not None else r.steps


def tau_value(r: RunInfo) -> float | None:
    best = r.eval.best if r.eval else None
    return None if best is None else best.tau


# key -> (what it sorts by, in words; the value, larger first; None last)
SORTS: dict[str, tuple[str, Callable[[RunInfo], float | None]]] = {
    "start": ("start time, newest first", lambda r: r.created),
    "tok/s": ("best tok/s, highest first", lambda r: r.best_tok_s),
    "tau": ("best held-out τ, highest first", tau_value),
    "steps": ("steps reached, most first", lambda r: float(shown_steps(r))),
}
SORT_ALIASES = {"toks": "tok/s", "τ": "tau", "time": "start", "created": "start"}


def sort_key(name: str) -> str:
    """The canonical sort key for `name` (a key or an alias); RunsViewError for none."""
    key = SORT_ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in SORTS:
        raise RunsViewError(f"--sort {name!r}: no such key (one of: {', '.join(SORTS)})")
    return key


def sort_runs(runs: list[RunInfo], key: str | None, reverse: bool = False) -> list[RunInfo]:
    """`runs` ordered by `key` (larger first; runs without the value last, in list order);
    None: as listed (oldest first). `reverse` turns the order of the valued ones round."""
    if key is None:
        return list(reversed(runs)) if reverse else list(runs)
    value = SORTS[key][1]
    valued = [(v, i, r) for i, r in enumerate(runs) if (v := value(r)) is not None]
    valued.sort(key=lambda t: (-t[0] if not reverse else t[0], t[1]))
    return [r for _, _, r in valued] + [r for r in runs if value(r) is None]


@dataclass(frozen=True)
class RunFilter:
    """Whitespace-separated terms, all of which a run must match: `outcome:KIND` (one of the
    outcome kinds, or the start of one: `outcome:crash`), else text found, case-insensitive,
    in its id, name, phase, outcome or error."""

    text: str = ""
    kinds: tuple[str, ...] = ()
    words: tuple[str, ...] = ()

    def matches(self, r: RunInfo) -> bool:
        outcome = run_outcome(r)
        if self.kinds and outcome.kind not in self.kinds:
            return False
        hay = " ".join(
            s for s in (r.run_id, r.name, r.phase, outcome.kind, outcome.summary, r.error) if s
        ).lower()
        return all(w in hay for w in self.words)


def parse_filter(text: str) -> RunFilter:
    """RunsViewError for an `outcome:` term no outcome kind starts with, or control
    characters (a filter is typed, never pasted escape sequences)."""
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise RunsViewError(f"--filter {text!r}: control characters are no filter")
    kinds: list[str] = []
    words: list[str] = []
    for term in text.lower().split():
        if term.startswith("outcome:"):
            want = term.removeprefix("outcome:")
            found = [k for k in OUTCOMES if want and k.startswith(want)]
            if not found:
                raise RunsViewError(
                    f"--filter {term!r}: no such outcome (one of: {', '.join(OUTCOMES)})"
                )
            kinds += found
        else:
            words.append(term)
    return RunFilter(text, tuple(kinds), tuple(words))


def view(
    runs: list[RunInfo], filter_text: str = "", sort: str | None = None, reverse: bool = False
) -> list[RunInfo]:
    """The runs shown: filtered, then sorted. RunsViewError for a bad filter or key."""
    f = parse_filter(filter_text)
    key = sort_key(sort) if sort is not None else None
    return sort_runs([r for r in runs if f.matches(r)], key, reverse)


# -- columns ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Column:
    name: str
    header: str
    cell: Callable[[RunInfo], str]
    right: bool = False  # numbers align right
    flexible: bool = False  # takes the width left, cut with "…" below its natural width
    min_width: int = 0  # a flexible column's least width worth showing


def _tok_s(r: RunInfo) -> str:
    return "—" if r.best_tok_s is None else implausible(r.best_tok_s) or f"{r.best_tok_s:,.0f}"


def _outcome(r: RunInfo) -> str:
    """How it ended, and the run's files the agent refused (a folder or FIFO where a file
    should be, a torn record): named here, since the outcome was settled without them."""
    bad = f" (unreadable: {', '.join(r.unreadable)})" if r.unreadable else ""
    return run_outcome(r).summary + bad


# In priority order: at a narrow width the last ones go first (the id and how it ended stay).
COLUMNS = (
    Column("id", "RUN ID", lambda r: r.run_id),
    Column("outcome", "OUTCOME", _outcome, flexible=True, min_width=16),
    Column("steps", "STEPS", lambda r: count(shown_steps(r)), right=True),
    Column("toks", "BEST TOK/S", _tok_s, right=True),
    Column("tau", "BEST τ", best_tau, right=True),
    Column("phase", "PHASE", lambda r: r.phase or "—"),
    Column("error", "ERROR", lambda r: r.error or "", flexible=True, min_width=12),
)
ID_LIMIT = 45  # a run id is cut at this (its hash suffix is in its first 45 characters)
OUTCOME_LIMIT = 100  # the outcome's words past this are the run info's (i) to show


def natural_width(c: Column, runs: list[RunInfo]) -> int:
    limit = ID_LIMIT if c.name == "id" else OUTCOME_LIMIT if c.flexible else 40
    return max([len(c.header)] + [min(limit, len(c.cell(r))) for r in runs])


def plan_columns(
    runs: list[RunInfo], width: int | None, names: tuple[str, ...], gap: int = 2
) -> list[tuple[Column, int]]:
    """The columns of `names` that fit `width` (None: all, each at its natural width), each
    with its width, in the order of `names`: taken in priority order at their natural width
    (a flexible one at its least), a column that does not fit left out, then the width left
    given to the flexible ones in priority order. `gap`: what each column costs beyond its
    cells (the spaces or the table's padding)."""
    wanted = [c for c in COLUMNS if c.name in names]
    natural = {c.name: natural_width(c, runs) for c in wanted}
    if width is None:
        return sorted(
            ((c, natural[c.name]) for c in wanted), key=lambda cw: names.index(cw[0].name)
        )
    chosen: list[tuple[Column, int]] = []
    used = 0
    for c in wanted:
        w = min(natural[c.name], c.min_width) if c.flexible else natural[c.name]
        if used + w + gap <= width or not chosen:  # the id always shows, cut if it must
            chosen.append((c, w))
            used += w + gap
    left = max(0, width - used)
    grown = []
    for c, least in chosen:
        extra = min(left, natural[c.name] - least) if c.flexible else 0
        left -= extra
        grown.append((c, least + extra))
    if grown and grown[0][0].name == "id" and used > width:
        c, w = grown[0]
        grown[0] = (c, max(8, w - (used - width)))
    return sorted(grown, key=lambda cw: names.index(cw[0].name))


def fit(text: str, width: int) -> str:
    """`text` in `width` characters: whole, or cut with "…"."""
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"
