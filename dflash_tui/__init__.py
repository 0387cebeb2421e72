"""dflash-tui: the monitor and control half. Never imports torch (ARCHITECTURE.md)."""
