"""The dispatcher (dflash_tui/cli.py) over the subcommand modules (dflash_tui/commands/):
every module's subcommand is reachable by its name, in `--help`'s list, with its own parser;
and what a group can run (commands/groups.py) is what the parsers offer a GROUP for."""

from __future__ import annotations

import importlib
import pkgutil

import dflash_tui.commands as package
from dflash_tui import cli
from dflash_tui.commands import groups
from dflash_tui.commands.options import GROUP_COMMANDS
from dflash_tui.commands.subcommand import Subcommand


def declared() -> dict[str, Subcommand]:
    """Every Subcommand the modules of dflash_tui/commands/ declare."""
    found: dict[str, Subcommand] = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for command in getattr(module, "SUBCOMMANDS", ()):
            assert command.name not in found, f"{command.name} declared twice"
            found[command.name] = command
    return found


def test_every_declared_subcommand_is_dispatched_with_its_own_parser() -> None:
    commands = declared()
    assert list(cli.SUBCOMMANDS) == list(cli.ORDER)
    assert set(commands) == set(cli.SUBCOMMANDS)
    for name, command in commands.items():
        assert cli.SUBCOMMANDS[name] == command.summary
        parser = cli.build_command_parser(name)
        assert parser.prog == f"dflash-tui {name}"
        assert parser.description == command.summary
        assert f"  {name:12s} {command.summary}" in cli.build_parser().epilog


def test_a_group_runs_exactly_the_commands_that_offer_a_group() -> None:
    assert set(groups.RUNNERS) == set(GROUP_COMMANDS)
    for name in cli.SUBCOMMANDS:
        usage = cli.build_command_parser(name).format_usage()
        assert ("TARGET|GROUP" in usage) == (name in GROUP_COMMANDS), name
