"""The heartbeat pane: what the trainer says it is doing, and how fresh that is."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from dflash_tui import diagnosis
from dflash_tui.fmt import duration, rate
from dflash_tui.state import Store


class HeartbeatPane(Static):
    DEFAULT_CSS = """
    HeartbeatPane { height: auto; padding: 0 1; }
    """

    def update_from(self, s: Store) -> None:
        hb = s.heartbeat
        t = Table.grid(padding=(0, 1))
        t.add_column(style="dim", width=12)
        t.add_column()
        if hb is None:
            exit_info = s.exit_info()
            if s.run_id is None:
                t.add_row("run", "no run under the run root yet")
            elif exit_info:
                t.add_row("exited", Text(str(exit_info), style="red"))
            else:
                t.add_row("heartbeat", Text("none yet", style="yellow"))
            if s.heartbeat_error:
                t.add_row("unreadable", Text(s.heartbeat_error, style="red"))
            self.update(t)
            return
        phase, age = s.phase()
        progress = hb.get("phase_progress") or {}
        what = Text(f"{phase} for {duration(age)}", style="bold")
        if progress.get("total"):
            what.append(
                f"  ({progress.get('unit', '')} {progress.get('done')}/{progress.get('total')})"
            )
        t.add_row("phase", what)
        expectation = getattr(diagnosis, "phase_expectation", lambda _s: None)(s)
        if expectation:
            t.add_row("", Text(expectation, style="dim italic"))
        hb_age = s.heartbeat_age()
        t.add_row(
            "heartbeat",
            Text(f"{duration(hb_age)} ago", style="red" if (hb_age or 0) > 6 else "green"),
        )
        last = hb.get("last_step_at")
        since = s.remote_now() - float(last) if isinstance(last, int | float) else None
        t.add_row(
            "last step",
            f"step {hb.get('step')} · {duration(since)} ago"
            if since is not None
            else f"step {hb.get('step')} · none yet",
        )
        t.add_row("throughput", rate(hb.get("tok_s")))
        t.add_row("pid", f"{hb.get('pid')} (pgid {hb.get('pgid')}) on {hb.get('host')}")
        deployed = ((s.hello or {}).get("deployed") or {}).get("sha256")
        running = hb.get("code_sha256")
        if deployed and running:
            same = deployed == running
            t.add_row(
                "code",
                Text(
                    f"running = deployed ({running[:10]})"
                    if same
                    else f"running {running[:10]} ≠ deployed {deployed[:10]}",
                    style="green" if same else "bold red",
                ),
            )
        wandb = getattr(diagnosis, "wandb_info", None)
        info = wandb(s) if wandb else hb.get("wandb")
        if info and info.get("mode") not in (None, "disabled"):
            t.add_row("wandb", f"{info.get('mode')} {info.get('id') or ''} {info.get('url') or ''}")
        comp = hb.get("compile") or {}
        if comp.get("warmup_s") is not None:
            line = (
                f"warm-up {comp['warmup_s']:.1f}s · {comp.get('graphs')} graphs"
                f" · {comp.get('recompiles')} recompiles"
            )
            if comp.get("cache_hits") is not None:
                # Misses mean kernels were generated: a cold cache explains a slow compile.
                line += f" · cache {comp['cache_hits']} hit / {comp.get('cache_misses')} miss"
            t.add_row("compile", line)
        gil = hb.get("gil") or {}
        if gil.get("samples"):
            t.add_row("GIL", f"wake-up late p50 {gil['p50_ms']:.1f}ms p99 {gil['p99_ms']:.1f}ms")
        if hb.get("error"):
            t.add_row("error", Text(str(hb["error"].get("message")), style="bold red"))
        self.update(t)
