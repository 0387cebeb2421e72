"""The one exception a command handler raises on purpose."""

from __future__ import annotations


class CommandError(Exception):
    """A command refused or failed for a reason the operator can act on; its message is the
    result's `error`, without a traceback. `bad_input`: the command named something that is
    not there or not valid (no such run or step): the CLI exits 2 for it, not 1."""

    def __init__(self, message: str, bad_input: bool = False) -> None:
        super().__init__(message)
        self.bad_input = bad_input
