"""What every `python -m trainer …` command line shares: bad arguments are one line and exit
2, like every other bad input (argparse would add a usage line)."""

from __future__ import annotations

import argparse
import typing

from trainer.config import one_line


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"error: {one_line(message)} (see {self.prog} --help)\n")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be 1 or more")
    return value
