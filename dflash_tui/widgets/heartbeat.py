"""The heartbeat pane: what the trainer says it is doing, and how fresh that is; for a run
that evaluates, its held-out τ (dflash_tui/evaluation.py) fitted to the pane's width."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from dflash_tui import compile_progress, cuda_graphs, evaluation, offline
from dflash_tui.diagnosis import wandb_info
from dflash_tui.facts import phase_expectation
from dflash_tui.fmt import count, duration, rate
from dflash_tui.state import Store
from dflash_tui.widgets import quiet, safe

LABEL = 12  # the label column, then one column between it and the value


class HeartbeatPane(Static):
    DEFAULT_CSS = """
    HeartbeatPane { height: auto; padding: 0 1; }
    """

    def update_from(self, s: Store) -> None:
        hb = s.heartbeat
        t = Table.grid(padding=(0, 1))
        t.add_column(style="dim", width=LABEL)
        t.add_column()
        if hb is None:
            outcome = s.outcome()
            if s.run_id is None:
                t.add_row("run", safe.text(offline.no_run(s)))  # names the root searched
            elif outcome is not None:
                t.add_row("exited", safe.text(outcome.summary, "red"))
            else:
                t.add_row("heartbeat", Text("none yet", style="yellow"))
            if s.heartbeat_error:
                t.add_row("unreadable", safe.text(s.heartbeat_error, "red"))
            quiet.update(self, t)
            return
        note = s.heartbeat_note()
        if note:
            t.add_row("schema", safe.text(note, "bold yellow"))
        phase, age = s.phase()
        progress = hb.phase_progress
        outcome = s.outcome()
        ended = outcome is not None  # its ages to the minute: nothing moves any more
        what = safe.text(f"{phase} for {duration(age, ended)}", "bold")
        if outcome is not None and outcome.word != phase:
            # A SIGKILLed run's last heartbeat still says `training`: say how it ended.
            what = safe.text(f"{outcome.word} (its last heartbeat said {phase})", "bold")
        compiling = compile_progress.detail(hb, s.remote_now())
        if compiling is not None:  # the graph under way is the host's label
            what.append(safe.text(f" ({compiling})"))
        elif progress is not None and progress.total:
            what.append(safe.text(f"  ({progress.unit} {progress.done}/{progress.total})"))
        t.add_row("phase", what)
        expectation = phase_expectation(s)
        if expectation:
            t.add_row("", safe.text(expectation, "dim italic"))
        hb_age = s.heartbeat_age()
        t.add_row(
            "heartbeat",
            Text(
                f"{duration(hb_age, ended)} ago",
                style="red" if (hb_age or 0) > 6 and not ended else "green",
            ),
        )
        if s.heartbeat_error:
            t.add_row("unreadable", safe.text(s.heartbeat_error, "red"))
        since = s.remote_now() - hb.last_step_at if hb.last_step_at is not None else None
        t.add_row(
            "last step",
            f"step {count(hb.step)} · {duration(since, ended)} ago"
            if since is not None
            else f"step {count(hb.step)} · none yet",
        )
        t.add_row("throughput", rate(hb.tok_s))
        tau = evaluation.of_store(s)
        if tau is not None:
            self._tau_rows(t, tau)
        if s.ended():  # not a live process: said as the one that was
            t.add_row("pid", safe.text(f"{hb.pid} on {hb.host}, exited", "dim"))
        else:
            t.add_row("pid", safe.text(f"{hb.pid} (pgid {hb.pgid}) on {hb.host}"))
        deployed = s.hello.deployed.sha256 if s.hello and s.hello.deployed else ""
        running = hb.code_sha256
        if deployed and running:
            same = deployed == running
            t.add_row(
                "code",
                safe.text(
                    f"running = deployed ({running[:10]})"
                    if same
                    else f"running {running[:10]} ≠ deployed {deployed[:10]}",
                    "green" if same else "bold red",
                ),
            )
        info = wandb_info(s)
        if info and info.mode not in ("", "disabled"):
            t.add_row("wandb", safe.text(f"{info.mode} {info.id or ''} {info.url or ''}"))
        comp = hb.compile
        if comp.warmup_s is not None:
            line = (
                f"warm-up {comp.warmup_s:.1f}s · {comp.graphs} graphs"
                f" · {comp.recompiles} recompiles"
            )
            if comp.cache_hits is not None:
                # Misses mean kernels were generated: a cold cache explains a slow compile.
                line += f" · cache {comp.cache_hits} hit / {comp.cache_misses} miss"
            t.add_row("compile", line)
        gpus = bool(s.gpu and s.gpu.devices)
        for place, g in cuda_graphs.places(hb):
            if not gpus and not g.enabled:
                continue  # a run with no GPU has no graphs to speak of (`status` still says why)
            style = "yellow" if cuda_graphs.fell_back(g) else ""
            t.add_row("graphs", safe.text(cuda_graphs.describe(place, g), style))
        if hb.gil.samples:
            t.add_row("GIL", f"wake-up late p50 {hb.gil.p50_ms:.1f}ms p99 {hb.gil.p99_ms:.1f}ms")
        if hb.error is not None:
            t.add_row("error", safe.text(hb.error.message, "bold red"))
        quiet.update(self, t)

    def _tau_rows(self, t: Table, tau: evaluation.TauSummary) -> None:
        """`held-out  τ 2.31 ↑0.12 at step 2000 (best 2.50 at step 1500; comparable runs'
        best 2.80)` in the longest form that fits; what the eval is doing; its error."""
        room = self.size.width - LABEL - 1
        line = tau.fitted(room) if room > 0 else tau.forms()[0]  # before the first layout
        style = {"up": "green", "down": "yellow"}.get(tau.trend or "", "")
        t.add_row("held-out", Text(line, style=style))
        doing = tau.state()
        if doing:
            t.add_row("eval", Text(doing, style="yellow" if tau.info.skipped else ""))
        if tau.info.error is not None:  # the host's words
            t.add_row("eval error", safe.text(tau.info.error, "bold red"))
