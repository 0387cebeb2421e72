"""One processes-mode job over the hosts of a config.toml group (`[groups.NAME]`,
targets.py): `launch`, `kill`, `restart`, `status` and `dump-stacks` of GROUP act on every
host at once, each through its own link (the one-host command path: oneshot.with_link,
control.py), node i on hosts[i].

Every node of the job has a run dir of the same id under its own host's run root: the monitor
picks the id once (`nodes.new_run_id`, the agent's rule) and sends each host its place
(`NodePlace`: the id, the node count, its node rank, node 0's rendezvous). A launch that fails
on one host stops the nodes launched on the others (their ranks would wait for a peer that
never comes). Kills go through each host's agent, which signals only what it proves is the
run (agent/identity.py). Each line names the group, the host and its node; every string from
a host is sanitised before the terminal (oneshot.out, oneshot.err, sanitize.lines).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import re
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from dflash_tui import control, sanitize
from dflash_tui.commands import oneshot
from dflash_tui.control import ControlError
from dflash_tui.headless import EXIT_UNREACHABLE, Headless
from dflash_tui.targets import Group, Target, TargetError, resolve_target
from trainer.contract.nodes import NodePlace, new_run_id
from trainer.contract.protocol import Progress

if TYPE_CHECKING:
    from dflash_tui.link.link import Link
    from dflash_tui.state import Store

# A group's hosts are configured in config.toml, each its own: one value for all is refused.
PER_HOST = ("run_root", "remote_dir", "pct", "exec_prefix", "python", "identity", "known_hosts")
RUN_NAME = re.compile(r"^\d{8}-\d{6}-(.+)-[0-9a-f]{4}$")  # nodes.new_run_id's shape


class Node:
    """One host of the group: its target, its place, and how its lines begin."""

    def __init__(self, group: Group, rank: int, target: Target) -> None:
        self.rank = rank
        self.target = target
        self.head = f"{group.name}: {target.name} node {rank}"

    def out(self, text: str) -> None:
        oneshot.out(f"{self.head} {text}")

    def err(self, text: str) -> None:
        oneshot.err(f"{self.head}: {text}")

    def progress(self, event: Progress) -> None:
        print(f"  … {sanitize.field(f'{self.target.name}: {event.message}')}", file=sys.stderr)


def nodes_of(group: Group, args: argparse.Namespace) -> list[Node]:
    """Each host as its config.toml target, its ssh config checked (options.target_from)."""
    from dflash_tui.link.hostkeys import host_key_policy

    given = [k for k in PER_HOST if getattr(args, k, None) is not None]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise TargetError(
            f"{flag} with group {group.name}: each host's comes from its [targets.*] table"
        )
    nodes = []
    for rank, host in enumerate(group.hosts):
        target = resolve_target(host)
        if target.kind == "ssh":
            host_key_policy(target)
        nodes.append(Node(group, rank, target))
    return nodes


def place(group: Group, node: Node, run_id: str) -> NodePlace:
    return NodePlace(
        run_id=run_id, nodes=len(group.hosts), node_rank=node.rank, master=group.master
    )


async def on_host(node: Node, work: oneshot.Work, args: argparse.Namespace) -> int:
    """`work` over the host's own one-shot link; a ControlError is its answer (exit 2)."""

    async def guarded(link: Link, store: Store) -> int:
        try:
            return await work(link, store)
        except ControlError as e:
            node.err(str(e))
            return 2

    return await oneshot.with_link(
        node.target, guarded, connect_timeout=oneshot.connect_timeout(args), err=node.err
    )


async def job_run(node: Node, args: argparse.Namespace) -> str | None:
    """The job's run id: --run, else node 0's alive run, else its newest (node 0 holds the
    job's run dir). None, said, when node 0 cannot tell."""
    if getattr(args, "run_id", None):
        return str(args.run_id)
    found: list[str] = []

    async def work(link: Link, store: Store) -> int:
        runs = await control.list_runs(link, store)
        alive = store.alive_run if store.alive_run not in (None, "?") else None
        if alive is None and runs:
            alive = max(runs, key=lambda r: r.created).run_id
        if alive is None:
            node.err(f"no runs under {store.hello.run_root if store.hello else '?'}")
            return 2
        found.append(alive)
        return 0

    await on_host(node, work, args)
    return found[0] if found else None


async def launch(group: Group, nodes: list[Node], args: argparse.Namespace) -> int:
    """One run id for the job, node i launched on hosts[i], all at once; if one fails, the
    nodes launched are stopped and the failure named (exit 1; 3 when a host was unreachable)."""
    text, name = control.read_config(args.config)
    overrides = control.check_overrides(args.overrides, text)
    run_id = new_run_id(name)

    async def one(node: Node) -> int:
        async def work(link: Link, store: Store) -> int:
            run = await control.launch_text(
                link, text, name, overrides, node.progress, place(group, node, run_id)
            )
            note = "" if run.started else f" ({run.note})"
            node.out(f"launched {run.run_id} in {run.run_dir}{note}")
            return 0

        return await on_host(node, work, args)

    codes = await asyncio.gather(*(one(n) for n in nodes))
    failed = [n for n, c in zip(nodes, codes, strict=True) if c != 0]
    if not failed:
        return 0
    # The others' ranks would wait at the rendezvous for ever: stop whatever was launched,
    # on every host (a host whose answer was lost may have launched too).
    stopped = await asyncio.gather(*(_stop(n, run_id, args, quiet=n in failed) for n in nodes))
    named = ", ".join(n.target.name for n in failed)
    was = [n.target.name for n, s in zip(nodes, stopped, strict=True) if s]
    oneshot.err(
        f"{group.name}: launch of {run_id} failed on {named}; "
        + (f"stopped the nodes launched on {', '.join(was)}" if was else "nothing left running")
    )
    return EXIT_UNREACHABLE if EXIT_UNREACHABLE in codes else 1


async def _stop(node: Node, run_id: str, args: argparse.Namespace, quiet: bool) -> bool:
    """Kill `run_id` on the host if it lives there (ended_ok); True when it was stopped.
    `quiet`: the host's launch failed, so no such run is expected there: say nothing unless
    something was stopped."""
    stopped: list[bool] = []

    async def work(link: Link, store: Store) -> int:
        timeout = getattr(args, "timeout", None)  # restart's and kill's; launch has none
        k = await control.kill(link, run_id, timeout, None, node.progress, True)
        if not k.not_running:
            stopped.append(True)
            node.out(f"stopped {k.run_id}: {k.describe()}")
        return 0

    err = (lambda _text: None) if quiet else node.err
    await oneshot.with_link(
        node.target, work, connect_timeout=oneshot.connect_timeout(args), err=err
    )
    return bool(stopped)


async def kill(group: Group, nodes: list[Node], args: argparse.Namespace) -> int:
    """The job's run killed on every host at once; a host where it had ended already says
    so. Exit: the worst host's; 1 when it lived nowhere."""
    run_id = await job_run(nodes[0], args)
    if run_id is None:
        return 2
    lived: list[Node] = []

    async def one(node: Node) -> int:
        async def work(link: Link, store: Store) -> int:
            k = await control.kill(
                link, run_id, args.timeout, args.drain_timeout, node.progress, True
            )
            if k.not_running:
                node.out(f"{k.run_id}: {k.not_running}")
                return 0
            lived.append(node)
            node.out(
                f"{k.run_id} {k.describe(node.rank == 0)}; {k.stop_s:.1f}s; "
                f"orphans: {k.orphans or 'none'}"
                + (f"; GPU memory still held by pids {k.gpu_held_by}" if k.gpu_held_by else "")
            )
            return 0 if not k.orphans and not k.gpu_held_by else 1

        return await on_host(node, work, args)

    codes = await asyncio.gather(*(one(n) for n in nodes))
    if not lived and not any(codes):
        oneshot.err(f"{group.name}: nothing of {run_id} was alive on any host")
        return 1
    return max(codes)


async def restart(group: Group, nodes: list[Node], args: argparse.Namespace) -> int:
    """Every host restarts the job's run as one new run id: node 0 resumes its newest good
    checkpoint (or starts fresh, as asked), the others launch its config fresh and get the
    position and the drafter from node 0. A host that fails stops the others' new nodes."""
    if getattr(args, "more_steps", 0) or getattr(args, "new_schedule", False):
        oneshot.err(f"{group.name}: --more-steps continues one host's run, not a group's job")
        return 2
    if getattr(args, "overrides", None) or getattr(args, "drops", None):
        oneshot.err(f"{group.name}: --set/--drop edit one host's run, not a group's job")
        return 2
    old = await job_run(nodes[0], args)
    if old is None:
        return 2
    m = RUN_NAME.match(old)
    new = new_run_id(m.group(1) if m else "run")

    async def one(node: Node) -> int:
        async def work(link: Link, store: Store) -> int:
            r = await control.restart(
                link, old, args.timeout, args.drain_timeout, node.progress, args.fresh,
                place(group, node, new),
            )  # fmt: skip
            if r.killed is not None:
                node.out(f"{r.killed.run_id} {r.killed.describe(node.rank == 0)}")
            if node.rank == 0:
                node.out(r.describe())
            else:  # it resumes nothing itself: node 0 hands it the position
                node.out(f"restarted as {r.launched.run_id} with {old}'s config, joining node 0")
            return 0

        return await on_host(node, work, args)

    codes = await asyncio.gather(*(one(n) for n in nodes))
    failed = [n for n, c in zip(nodes, codes, strict=True) if c != 0]
    if not failed:
        return 0
    await asyncio.gather(*(_stop(n, new, args, quiet=n in failed) for n in nodes))
    oneshot.err(
        f"{group.name}: restart of {old} as {new} failed on "
        f"{', '.join(n.target.name for n in failed)}; its new nodes stopped"
    )
    return EXIT_UNREACHABLE if EXIT_UNREACHABLE in codes else 1


async def dump_stacks(group: Group, nodes: list[Node], args: argparse.Namespace) -> int:
    """Each host's dump of the job's run (every rank on it), printed host by host."""
    run_id = await job_run(nodes[0], args)
    if run_id is None:
        return 2
    texts: dict[int, str] = {}

    async def one(node: Node) -> int:
        async def work(link: Link, store: Store) -> int:
            st = await control.dump_stacks(link, not args.no_pyspy, run_id)
            parts = [sanitize.lines(st.text)]
            if st.pyspy:
                parts.append("# py-spy dump --native\n" + sanitize.lines(st.pyspy))
            if st.seconds is not None:
                parts.append(
                    f"# {st.kind} dump of pid {st.pid}, {st.seconds:.2f}s after the signal"
                )
            texts[node.rank] = "\n".join(parts)
            return 0

        return await on_host(node, work, args)

    codes = await asyncio.gather(*(one(n) for n in nodes))
    for node in nodes:
        if node.rank in texts:
            print(f"=== {sanitize.field(node.head)} ===\n{texts[node.rank]}", flush=True)
    return max(codes)


async def status(group: Group, nodes: list[Node], args: argparse.Namespace) -> int:
    """`status` of the job's run on each host (the one-host snapshot, ranks included), all
    at once; text headed by host, or with --json one object: {group, run_id, hosts: [{host,
    node, exit, snapshot}]}. Exit: the worst host's."""
    run_id = await job_run(nodes[0], args)
    if run_id is None:
        return EXIT_UNREACHABLE

    async def one(node: Node) -> tuple[int, str]:
        out = io.StringIO()  # its lines, printed in node order once all have answered
        code = await Headless(
            node.target, out=out, as_json=args.json, once=True, follow=run_id,
            connect_timeout=oneshot.connect_timeout(args),
        ).run()  # fmt: skip
        return code, out.getvalue()

    answers = await asyncio.gather(*(one(n) for n in nodes))
    if args.json:  # the snapshot lines are JSON already (the host's text escaped)
        hosts = []
        for node, (code, text) in zip(nodes, answers, strict=True):
            lines = [json.loads(x) for x in text.splitlines() if x.startswith("{")]
            hosts.append(
                {"host": node.target.name, "node": node.rank, "exit": code,
                 "snapshot": lines[-1] if lines else None}
            )  # fmt: skip
        print(json.dumps({"group": group.name, "run_id": run_id, "hosts": hosts}, default=str))
    else:
        for node, (_code, text) in zip(nodes, answers, strict=True):
            print(f"=== {sanitize.field(node.head)} ===", flush=True)
            print(text.rstrip("\n"), flush=True)  # Headless made it visible (say, sanitize)
    return max(code for code, _ in answers)


RUNNERS: dict[str, Callable[[Group, list[Node], argparse.Namespace], Awaitable[int]]] = {
    "launch": launch,
    "kill": kill,
    "restart": restart,
    "status": status,
    "dump-stacks": dump_stacks,
}


async def run(name: str, group: Group, args: argparse.Namespace) -> int:
    nodes = nodes_of(group, args)
    try:
        return await RUNNERS[name](group, nodes, args)
    except ControlError as e:  # a bad --config or --set, before anything was sent
        oneshot.err(str(e))
        return 2
