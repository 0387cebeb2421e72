"""Textual widgets of the dflash-tui screen. Each renders one part of the Store."""
