"""The one exception a command handler raises on purpose."""

from __future__ import annotations


class CommandError(Exception):
    """A command refused or failed for a reason the operator can act on; its message is the
    result's `error`, without a traceback."""
