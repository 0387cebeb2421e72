"""The `dflash-tui` subcommands, a module per subcommand or close group (cli.py dispatches)."""
