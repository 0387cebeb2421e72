"""`python -m trainer`'s subcommands besides training, and the argument rules they share."""
