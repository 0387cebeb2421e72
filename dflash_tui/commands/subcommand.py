"""What a subcommand module gives the dispatcher (cli.py): per subcommand, its line in
`dflash-tui --help`, its options and its work. The dispatcher builds the parser from these and
calls the chosen one; nothing of a subcommand lives in cli.py."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Subcommand:
    name: str
    summary: str  # its line in `dflash-tui --help`, and its own --help's description
    add_options: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]  # the parsed options to an exit code
    # argv as argparse must see it, where a value of this command's would read as an option
    prepare_argv: Callable[[list[str]], list[str]] | None = None
