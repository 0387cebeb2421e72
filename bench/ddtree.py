"""DDTree against the chain on the demo's chat target (issue 31): held-out τ with a draft tree
of 1, 16, 64 and 256 nodes per verify step, beside the chain's τ, and each eval's time. A
table printed last.

    .venv/bin/python bench/ddtree.py [RUN_DIR] [--step N] [--device cpu|cuda]
        [--prompts 8] [--new-tokens 64] [--nodes 1,16,64,256] [--out FILE.json]

RUN_DIR: a run of the demo config (trainer/configs/demo-cpu.toml: the target
builtin:tiny-qwen3-chat, the drafter trained on its own answers); its newest good checkpoint
unless --step. Without RUN_DIR the demo config is trained first, as `scripts/demo` trains
it but without the monitor, on the CPU, into a temporary run root (the builtins are built
into the cache on first use: ~1.5 min on 2 cores, then ~6 min of training).

Each node budget is one `python -m trainer eval RUN_DIR --tree-nodes N` in this process
(trainer/evaluation/acceptance.py; the run's eval/step-N.json is left holding the last
one): the chain decodes the held-out prompts, then the tree decodes the same prompts. The
chain's τ is the same at every budget (checked); its decoding time is tokens / tok/s, the
tree's is its own clock. Times are the decode loops alone, after a warm-up eval.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.evaluation.acceptance import evaluate  # noqa: E402

DEMO = ROOT / "trainer" / "configs" / "demo-cpu.toml"


def train_demo(root: Path, max_steps: int | None) -> Path:
    """A demo run under `root`, trained to the end (or `max_steps`): its run dir."""
    steps = ["--max-steps", str(max_steps)] if max_steps else []
    print(f"training the demo config into {root} (no RUN_DIR given) ...", flush=True)
    subprocess.run(
        [sys.executable, "-m", "trainer", "--config", str(DEMO), "--run-root", str(root),
         "--set", "runtime.wandb_mode=disabled", *steps],
        check=True, cwd=ROOT, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    (run,) = root.iterdir()
    return run


def measure(args: argparse.Namespace, run: Path) -> list[dict[str, Any]]:
    budgets = [int(n) for n in args.nodes.split(",")]
    # Warm-up: the first decode on a device pays for its kernels' first launches.
    evaluate(run, args.step, 1, 8, device=args.device, tree_nodes=budgets[0])
    rows = []
    for nodes in budgets:
        r = evaluate(run, args.step, args.prompts, args.new_tokens, device=args.device,
                     tree_nodes=nodes)  # fmt: skip
        tree = r["tree"]
        row = {
            "nodes": nodes, "step": r["step"], "prompts": r["prompts"],
            "new_tokens": r["new_tokens"], "device": r["device"],
            "chain_tau": r["tau"], "chain_s": round(r["tokens"] / r["tok_s"], 3),
            "tree_tau": tree["tau"], "tree_s": tree.get("seconds"),
            "tree_per_position": tree.get("per_position"),
            "not_measured": tree.get("not_measured"),
        }  # fmt: skip
        print(json.dumps(row), flush=True)
        rows.append(row)
    chain = {row["chain_tau"] for row in rows}
    if len(chain) != 1:  # the same drafter and prompts: the chain cannot change between evals
        raise SystemExit(f"the chain's τ changed between evals: {sorted(chain)}")
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    first = rows[0]
    out = [
        f"DDTree vs chain: step {first['step']}, {first['prompts']} held-out prompts × "
        f"{first['new_tokens']} tokens on {first['device']}",
        f"{'nodes':>6} {'chain τ':>8} {'tree τ':>8} {'×':>6} {'chain s':>8} {'tree s':>8}",
    ]
    for r in rows:
        if r["tree_tau"] is None:
            out.append(f"{r['nodes']:>6} {r['chain_tau']:>8.2f}  not measured: {r['not_measured']}")
            continue
        out.append(
            f"{r['nodes']:>6} {r['chain_tau']:>8.2f} {r['tree_tau']:>8.2f} "
            f"{r['tree_tau'] / r['chain_tau']:>6.2f} {r['chain_s']:>8.2f} {r['tree_s']:>8.2f}"
        )
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", nargs="?", type=Path, help="a demo run (default: train one)")
    p.add_argument("--step", type=int, help="its checkpoint (default: the newest good one)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--nodes", default="1,16,64,256", help="node budgets, comma-separated")
    p.add_argument("--train-steps", type=int, help="without RUN_DIR: train this many steps")
    p.add_argument("--out", type=Path, help="write the rows here as JSON")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="ddtree-bench-") as tmp:
        run = args.run_dir or train_demo(Path(tmp), args.train_steps)
        rows = measure(args, run)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
