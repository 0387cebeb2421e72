"""The agent's `read_page` (dflash_tui/agent/files.py): a page of whole lines ending at a
byte, as a replay pages back through a long telemetry.jsonl. Real files on disk."""

from __future__ import annotations

from dflash_tui.agent.files import read_page


def pages_back(folder: str, name: str, page: int) -> list[str]:
    out, before = [], None
    for _ in range(10_000):  # a pager that does not move would spin here, not pass
        text, start, _size = read_page(folder, name, page, before, lines=True)
        out.append(text)
        if start == 0:
            return out[::-1]
        assert before is None or start < before, (start, before)
        before = start
    raise AssertionError("the pages did not reach the start of the file")


def test_pages_of_whole_lines_make_up_the_file(tmp_path):
    lines = [f"line {i} " + "x" * (i % 37) + "\n" for i in range(500)]
    (tmp_path / "t.jsonl").write_text("".join(lines))
    for page in (64, 100, 1000, 1 << 20):
        got = pages_back(str(tmp_path), "t.jsonl", page)
        assert "".join(got) == "".join(lines)
        assert all(p == "" or p.endswith("\n") for p in got[:-1])
        assert all(p == "" or any(p.startswith(line) for line in lines) for p in got)


def test_a_line_longer_than_a_page_is_skipped_and_the_pager_moves_on(tmp_path):
    long = "L" * 5000 + "\n"
    (tmp_path / "t.jsonl").write_text("first\n" + long + "last\n")
    got = "".join(pages_back(str(tmp_path), "t.jsonl", 1000))
    assert got.startswith("first\n") and got.endswith("last\n")
    # Never whole in one page: left out (its head, cut, for the reader to count as
    # unreadable), not spun on.
    assert "L" * 5000 not in got and got.count("L") < 1000


def test_without_lines_it_is_the_plain_tail(tmp_path):
    (tmp_path / "t.log").write_text("abc\ndef\n")
    assert read_page(str(tmp_path), "t.log", 5) == ("\ndef\n", 3, 8)
    assert read_page(str(tmp_path), "t.log", 5, lines=True) == ("def\n", 4, 8)
    assert read_page(str(tmp_path), "t.log", 5, before=4, lines=True) == ("abc\n", 0, 8)
