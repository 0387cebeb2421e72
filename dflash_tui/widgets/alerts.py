"""Alerts: the diagnosis findings, each with its evidence and what to do."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.widgets import Static

from dflash_tui.diagnosis import Finding
from dflash_tui.widgets import quiet, safe

STYLE = {"critical": "bold red", "warning": "bold yellow", "info": "cyan"}


class AlertsPane(Static):
    DEFAULT_CSS = """
    AlertsPane { height: auto; padding: 0 1; }
    """

    def update_findings(self, findings: list[Finding]) -> None:
        if not findings:
            quiet.update(self, Text.assemble(("✓ nothing wrong that I can see", "green")))
            return
        parts = []
        for f in findings:
            # Findings quote the host (thread names, errors, log lines): all through `safe`.
            parts.append(
                Text.assemble(
                    (f"● {f.severity}: ", STYLE.get(f.severity, "")), safe.text(f.title, "bold")
                )
            )
            parts.append(safe.text(f"   {f.evidence}", "dim"))
            parts.append(safe.text(f"   → {f.action}", "italic"))
        quiet.update(self, Group(*parts))
