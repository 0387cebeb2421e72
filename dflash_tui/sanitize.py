"""Text from the training host made safe for a terminal: the one sanitiser every view uses.

Everything the host sends is untrusted: log lines, heartbeat strings, run ids, file texts,
agent error messages, GPU names. A view shows it only through these functions, at the
moment it writes to a terminal; the store keeps the exact text and `--json` stays exact.

Rules (what is not listed passes unchanged):
- every C0 control (U+0000-U+001F) except TAB, and NEWLINE where the view keeps lines;
  DEL (U+007F); every C1 control (U+0080-U+009F): shown as `\\xNN`;
- Unicode's Bidi_Control characters (U+061C, U+200E, U+200F, U+202A-U+202E,
  U+2066-U+2069: "Trojan source" reordering), the line and paragraph separators
  (U+2028, U+2029) and lone surrogates (which no terminal encoding can write): `\\uNNNN`;
- NEWLINE where a view shows one line: `\\n`;
- CR, in a line the host wrote (`line`, `lines`): a progress bar redrawn with CR
  (`10%\\r20%\\r30%`) is shown as its last state (`30%`); a CR at the end of a line (CRLF)
  is dropped. Elsewhere (`field`) a CR is shown as `\\r`: in a message composed from
  several strings the text before a CR is not one progress bar's older state.

An escape sequence is shown whole: its ESC (or C1 introducer), and the BEL or ESC that
ends an OSC/DCS/APC/PM/SOS string, are shown as escapes and the bytes between them are
printable already, so `\\x1b[2J` reads `\\x1b[2J` and `\\x1b]0;title\\x07` reads
`\\x1b]0;title\\x07`. Nothing of a sequence is interpreted, and nothing is dropped.

Why `\\x1b` and not the control pictures (`␛`): there are no pictures for C1 controls or
for bidi controls; `\\x1b` is ASCII, so it survives a terminal that is not UTF-8; it is the
form `repr()`, `less` and `journalctl` users know and can paste into `printf` or `grep -P`.
A literal backslash in the host's text is not doubled (Windows paths and regexes stay
readable), so the escaped form `\\x1b` and a host that printed those four characters look
the same on screen: the store and `--json` tell them apart.

Speed: a line with nothing to escape returns after one `str.isprintable()` scan (no copy);
anything else is one regular-expression split in C, each run of controls escaped once
(`unicode_escape`, cached for short runs). `limit` bounds the work and the output for a view
that cannot use a megabyte (a pane): the first `limit` characters, then how many were cut.
Total: any str in, a str out, never raises.
"""

from __future__ import annotations

import re

__all__ = ["field", "line", "lines"]

# Every character shown as an escape; TAB is left alone, NEWLINE only where lines are kept.
_CONTROLS = "\x00-\x08\x0b-\x1f\x7f-\x9f"
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_OTHER = "\u2028\u2029\ud800-\udfff"  # line/paragraph separators, lone surrogates
_ONE_LINE = re.compile(f"([\n{_CONTROLS}{_BIDI}{_OTHER}]+)")
_MANY_LINES = re.compile(f"([{_CONTROLS}{_BIDI}{_OTHER}]+)")


class _Runs(dict[str, str]):
    """A run of controls -> its escaped form; the short runs (one ESC, a CSI's C1) cached."""

    def __missing__(self, run: str) -> str:
        shown = run.encode("unicode_escape").decode("ascii")
        if len(run) <= 8 and len(self) < 4096:
            self[run] = shown
        return shown


_RUNS = _Runs()


def _escape(text: str, pattern: re.Pattern[str], collapse: bool, limit: int | None) -> str:
    if text.isprintable() and (limit is None or len(text) <= limit):
        return text
    if collapse and "\r" in text:
        text = "\n".join(_last_state(part) for part in text.split("\n"))
    cut = 0
    if limit is not None and len(text) > limit:
        cut, text = len(text) - max(0, limit), text[: max(0, limit)]
    pieces = pattern.split(text)
    pieces[1::2] = map(_RUNS.__getitem__, pieces[1::2])
    shown = "".join(pieces)
    return f"{shown} … (+{cut:,} characters)" if cut else shown


def _last_state(text: str) -> str:
    """What a terminal leaves of one line redrawn with CR: the part after the last CR that
    is not at its end."""
    text = text.rstrip("\r")
    return text[text.rfind("\r") + 1 :]


def field(text: str, newlines: bool = False, limit: int | None = None) -> str:
    """A string from the host, or a message quoting one, with every control visible
    (`\\r` too); `newlines=True` keeps NEWLINE (a traceback in a pane that shows lines)."""
    return _escape(text, _MANY_LINES if newlines else _ONE_LINE, False, limit)


def line(text: str, limit: int | None = None) -> str:
    """One line the host wrote (train.log, a step line): a CR-redrawn progress bar shows its
    last state; every other control is visible, NEWLINE as `\\n`."""
    return _escape(text, _ONE_LINE, True, limit)


def lines(text: str, limit: int | None = None) -> str:
    """A text the host wrote, NEWLINE kept (a stack dump, py-spy's output): each line as
    `line` shows it."""
    return _escape(text, _MANY_LINES, True, limit)
