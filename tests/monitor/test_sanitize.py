"""dflash_tui/sanitize.py: any str from the host comes out safe for a terminal."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_tui import sanitize

BIDI = {0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}
# What a terminal must never receive from the host, except where a view keeps lines.
DANGER = {*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0), *BIDI, 0x2028, 0x2029}

# The text the sanitiser is fed: anything, and the sequences that do harm, mixed into it.
ATTACKS = [
    "\x1b[2J",
    "\x1b]0;title\x07",
    "\x1b]8;;http://evil\x1b\\text\x1b]8;;\x1b\\",
    "\x1b]52;c;ZXZpbA==\x07",
    "\x9b2J",
    "\u202e",
    "10%\r20%\r30%",
    "[link=http://x]y[/link]",
    "\r\n",
    "\x00",
    "\ud800",
]
hostile = st.lists(st.one_of(st.text(), st.sampled_from(ATTACKS)), max_size=8).map("".join)


def assert_safe(shown: str, newline: bool) -> None:
    for ch in shown:
        if ch == "\n" and newline:
            continue
        assert ord(ch) not in DANGER, f"{ch!r} in {shown!r}"
        assert unicodedata.category(ch) != "Cs", f"a lone surrogate in {shown!r}"
    shown.encode("utf-8")  # every terminal encoding of it works


@given(hostile, st.booleans(), st.one_of(st.none(), st.integers(-5, 500)))
def test_field_is_safe_for_any_str(text: str, newlines: bool, limit: int | None) -> None:
    assert_safe(sanitize.field(text, newlines=newlines, limit=limit), newline=newlines)


@given(hostile, st.one_of(st.none(), st.integers(0, 500)))
def test_line_and_lines_are_safe_for_any_str(text: str, limit: int | None) -> None:
    one = sanitize.line(text, limit=limit)
    assert_safe(one, newline=False)
    assert "\r" not in one
    assert_safe(sanitize.lines(text, limit=limit), newline=True)


@given(st.text(st.characters(blacklist_categories=("Cc", "Cs"))))
def test_printable_text_is_unchanged(text: str) -> None:
    """Text with no control character, bidi control or separator passes as it is: the
    sanitiser never changes what an operator should read (unicode, markup-like brackets,
    backslashes)."""
    text = "".join(ch for ch in text if ord(ch) not in DANGER)
    assert sanitize.field(text) == text
    assert sanitize.line(text) == text
    assert sanitize.lines(text) == text
    assert sanitize.field(text + "\tx") == text + "\tx"  # TAB is kept


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[2J", r"\x1b[2J"),
        ("\x1b]0;title\x07", r"\x1b]0;title\x07"),
        (
            "\x1b]8;;http://evil\x1b\\text\x1b]8;;\x1b\\",
            "\\x1b]8;;http://evil\\x1b\\text\\x1b]8;;\\x1b\\",
        ),
        ("\x1b]52;c;ZXZpbA==\x07", r"\x1b]52;c;ZXZpbA==\x07"),
        ("\x9b2J", r"\x9b2J"),
        ("abc\u202edef", r"abc\u202edef"),
        ("[link=http://x]y[/link]", "[link=http://x]y[/link]"),
        ("a\x00b\x7fc", r"a\x00b\x7fc"),
    ],
)
def test_each_sequence_is_shown_whole_as_text(raw: str, shown: str) -> None:
    assert sanitize.field(raw) == shown
    assert sanitize.line(raw) == shown
    assert sanitize.lines(raw) == shown


def test_progress_bars_collapse_to_their_last_state_only_in_lines() -> None:
    assert sanitize.line("load 10%\rload 50%\rload 100%") == "load 100%"
    assert sanitize.line("step line\r\n") == r"step line\n"
    assert sanitize.lines("a 1%\ra 9%\nb\r\n") == "a 9%\nb\n"
    assert sanitize.field("a\rb") == r"a\rb"  # a message: nothing is hidden
    assert sanitize.field("a\nb") == r"a\nb" and sanitize.field("a\nb", newlines=True) == "a\nb"


def test_limit_cuts_and_says_how_much() -> None:
    assert sanitize.field("x" * 10, limit=4) == "xxxx … (+6 characters)"
    assert sanitize.line("\x1b" * 10, limit=2) == r"\x1b\x1b … (+8 characters)"
    assert sanitize.field("short", limit=10) == "short"
