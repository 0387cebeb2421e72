"""The tables of bench/SCALING.md: the seeds' workload (Qwen3.6-27B target, 5-layer drafter,
4096-token packs) in processes mode on 1, 2, 8 and 32 nodes of 8 GPUs (5 targets : 3 drafters
a node). Every input is read from the repo (the config, the model code, the recorded
measurements) or is an assumption named in LINKS; nothing else is typed in.

    .venv/bin/python bench/scaling.py           # rewrite the tables in bench/SCALING.md
    .venv/bin/python bench/scaling.py --print   # print them only
    .venv/bin/python bench/scaling.py --check   # exit 1 if SCALING.md's tables differ

Each figure is marked: measured (a recorded run), derived (arithmetic on measured figures
and the code), assumed (LINKS: a link speed, not measured here).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

DOC = BENCH / "SCALING.md"
BEGIN, END = "<!-- scaling.py: begin -->", "<!-- scaling.py: end -->"

# -- inputs ------------------------------------------------------------------------------
CONFIG_27B = ROOT / "trainer/configs/qwen3.6-27b-h200.toml"
CONFIG_8B = ROOT / "trainer/configs/qwen3-8b-h200.toml"
NODE_COUNTS = (1, 2, 8, 32)
# The operators' split: tests/fixtures/seed-scenarios/README.md:3-4 (GPUs 0-4 targets and
# prefetch, 5-7 drafter replicas).
T_PER_NODE, D_PER_NODE = 5, 3
# Recorded measurements, read from these files (parsed below, not copied):
HYBRID_LOG = BENCH / "results-workloads/hybrid-27b-summary.txt"  # "HYBRID fla=with ..."
LAUNCH_27B_LOG = BENCH / "results-workloads/27b-summary.txt"  # "RESULT 27b tok_s=..."
RESULTS_JSON = BENCH / "results.json"  # gpu_bench.py on the H200 (8B shapes), run E
MODES = "results-workloads/h200-modes-{}.jsonl"  # threads vs processes, one H200
SEEDS_LOG = ROOT / "tests/fixtures/seed-scenarios/step_lines.log"  # the seeds' 8-GPU run
GiB = 1e9  # decimal GB throughout: links are sold in decimal units


@dataclass(frozen=True)
class Link:
    name: str
    gbytes_s: float  # one direction
    scope: str


# Assumed link speeds (one direction): not measured here (only one-GPU machines were lent).
NVLINK = Link("NVLink (H200)", 450.0, "per GPU, intra-node: 900 GB/s both directions together")
LINKS = [
    Link("IB/RoCE 400G, a NIC per GPU", 3 * 50.0, "per node: the 3 drafter GPUs' own NICs"),
    Link("IB/RoCE 400G, one NIC", 50.0, "per node"),
    Link("Ethernet 200G", 25.0, "per node"),
    Link("Ethernet 100G", 12.5, "per node"),
]
# For the features with a NIC per GPU: the 5 target GPUs' NICs send them.
FEATURE_NICS_PER_GPU = 5 * 50.0
# The operators' box: 8x RTX PRO 6000 Blackwell (96 GB each) on PCIe, no NVLink. PCIe 5.0
# x16 is 64 GB/s a direction in theory; ~52 GB/s is what DMA gets after packet overhead, and
# a ring through a shared PCIe switch or root complex gets ~75 % of that: ~40 GB/s assumed
# with GPU peer-to-peer on. Without it (P2P off, common on workstation boards and across
# CPU sockets) NCCL stages every hop through host memory: about half, 20 GB/s assumed.
PCIE_BOX = "8× RTX PRO 6000 Blackwell (96 GB, PCIe, no NVLink)"
PCIE_THEORY = 64.0
PCIE = [
    Link("PCIe 5.0 x16, GPU peer-to-peer", 40.0, "effective ring bandwidth a GPU, one node"),
    Link("PCIe 5.0 x16, through host memory", 20.0, "the same, GPU peer-to-peer off"),
]


# -- reading the measurements ------------------------------------------------------------
def _match(path: Path, pattern: str) -> re.Match[str]:
    m = re.search(pattern, path.read_text())
    if not m:
        raise SystemExit(f"{path.relative_to(ROOT)}: no line matches {pattern!r}")
    return m


def _modes_stage_ms(mode: str, thread: str, stage: str) -> float:
    """Median of a stage's moving median over the measured window of bench/gpu_workloads.sh
    modes (bench/modes_report.py's window_steps)."""
    window = next(
        json.loads(line)["window_steps"]
        for line in (BENCH / MODES.format("modes")).read_text().splitlines()
        if json.loads(line)["mode"] == mode
    )
    lo, hi = (int(x) for x in window.split(".."))
    rows = [
        json.loads(line)
        for line in (BENCH / MODES.format(f"metrics-{mode}")).read_text().splitlines()
    ]
    return statistics.median(r["stages_ms"][thread][stage] for r in rows if lo <= r["step"] <= hi)


@dataclass(frozen=True)
class Measured:
    hybrid_layers: int
    hybrid_packed_ms: float  # fla, packed (6 documents), 4096 tokens
    launch_27b_tok_s: float  # one H200, every role on it
    drafter_8b_burst_s: float
    drafter_8b_sustained_s: float
    drafter_8b_flops: float
    target_8b_sustained_s: float
    opt_threads_ms: float  # 8B, one H200, threads mode: AdamW + clip
    opt_processes_ms: float  # the same + the gradient all_reduce through gloo (D = 1)
    seeds_tok_s: float  # 8 GPUs, 5:3


def measured() -> Measured:
    h = _match(HYBRID_LOG, r"HYBRID fla=with .*?layers=(\d+) .*? packed_ms=([\d.]+)")
    launch = _match(LAUNCH_27B_LOG, r"RESULT 27b tok_s=(\d+)")
    seeds = _match(SEEDS_LOG, r"\(([\d.]+)Ktok/s\)")
    res = json.loads(RESULTS_JSON.read_text())
    return Measured(
        hybrid_layers=int(h.group(1)),
        hybrid_packed_ms=float(h.group(2)),
        launch_27b_tok_s=float(launch.group(1)),
        drafter_8b_burst_s=res["drafter_compiled_layers_s"],
        drafter_8b_sustained_s=res["stage_drafter_sustained_s"],
        drafter_8b_flops=res["drafter_flops_per_step"],
        target_8b_sustained_s=res["stage_target_sustained_s"],
        opt_threads_ms=_modes_stage_ms("threads", "drafter-0", "optimizer"),
        opt_processes_ms=_modes_stage_ms("processes", "drafter-0", "optimizer"),
        seeds_tok_s=float(seeds.group(1)) * 1e3,
    )


# -- the model, by the repo's own code ---------------------------------------------------
@dataclass(frozen=True)
class Workload:
    name: str
    seq: int  # tokens a batch (one packed row)
    batch: int
    anchors: int
    packed: bool
    hidden: int
    layer_ids: tuple[int, ...]
    kept_layers: int
    kept_linear: int  # Gated DeltaNet layers among the kept ones
    trainable: int  # drafter parameters with requires_grad: what the all_reduce carries
    grad_bytes: int  # bytes an element of their gradient
    flops: float  # gpu_bench.drafter_flops of one step (one batch)


def target_info_27b() -> Any:
    from make_bench_target_qwen36 import NUM_LAYERS, TEXT, hybrid_layer_types
    from transformers import Qwen3_5TextConfig

    from trainer.targets.load import target_info_of

    c = Qwen3_5TextConfig(
        **TEXT, num_hidden_layers=NUM_LAYERS, layer_types=hybrid_layer_types(NUM_LAYERS)
    )
    return target_info_of(c)


def target_info_8b() -> Any:
    """The 8B bench target's shape, as bench/make_bench_target.py builds it."""
    from make_bench_target import qwen3_8b_config  # bench/, beside this file

    from trainer.targets.load import target_info_of

    return target_info_of(qwen3_8b_config())


def meta_drafter(config: Path, info: Any) -> tuple[Any, Any, Any, tuple[int, ...]]:
    """(config, arch, drafter, read layer ids): the drafter built on the meta device from the
    config and the target's shape, as trainer/runtime/setup.py build_run builds it
    (drafter_arch, DFlashDrafter); nothing allocated."""
    import torch

    from trainer.config import load_config
    from trainer.model.drafter import DFlashDrafter
    from trainer.runtime.setup import drafter_arch
    from trainer.targets.load import default_target_layer_ids

    cfg = load_config(config)
    n = cfg.drafter.num_layers
    ids = tuple(cfg.drafter.target_layer_ids or default_target_layer_ids(info.num_layers, n))
    arch = drafter_arch(cfg, info, list(ids), info.vocab_size - 1)
    meta = torch.device("meta")
    embed = torch.empty(info.vocab_size, info.hidden_size, device=meta)
    head = torch.empty(info.vocab_size, info.hidden_size, device=meta)
    with meta:
        model = DFlashDrafter(arch, embed, head)
    return cfg, arch, model, ids


def workload(config: Path, info: Any) -> Workload:
    """The workload of the config's drafter (`meta_drafter`) on the target's shape."""
    import gpu_bench
    import torch

    cfg, arch, model, ids = meta_drafter(config, info)
    n = cfg.drafter.num_layers
    train = [p for p in model.parameters() if p.requires_grad]
    kept = max(ids) + 1
    linear = sum(t != "full_attention" for t in info.layer_types[:kept])
    # gpu_bench's analytic FLOPs (bench/gpu_bench.py drafter_flops), for this shape
    sh = gpu_bench.Shapes(False)
    sh.H, sh.L, sh.heads, sh.kv = (
        info.hidden_size,
        info.num_layers,
        arch.num_heads,
        arch.num_kv_heads,
    )
    sh.D, sh.I, sh.V, sh.n_draft = arch.head_dim, arch.intermediate_size, info.vocab_size, n
    sh.bs, sh.N, sh.S, sh.B = arch.block_size, cfg.train.num_anchors, max(cfg.data.seq_buckets), 1
    blocks = gpu_bench.synthetic_blocks(sh, torch.device("cpu"))
    flops = gpu_bench.drafter_flops(sh, gpu_bench.visible_pairs(blocks, sh))
    return Workload(
        name=cfg.name,
        seq=max(cfg.data.seq_buckets),
        batch=cfg.train.batch_size,
        anchors=cfg.train.num_anchors,
        packed=cfg.data.packing,
        hidden=info.hidden_size,
        layer_ids=ids,
        kept_layers=kept,
        kept_linear=linear,
        trainable=sum(p.numel() for p in train),
        grad_bytes=train[0].element_size(),
        flops=flops,
    )


def message_bytes(w: Workload) -> dict[str, int]:
    """trainer/distributed/transfer.py FeatureSender.send: header (HEADER int64), the ints
    (receive's n_ints int64), the loss mask (float32), the features (bf16 on a GPU: the target's
    dtype)."""
    from trainer.distributed.transfer import HEADER

    B, L, N = w.batch, w.seq, w.anchors
    n_ints = B * L + B + 2 * B * N + (2 * B * L if w.packed else 0)
    return {
        "header": HEADER * 8,
        "ints": n_ints * 8,
        "loss mask": B * L * 4,
        "features": B * L * len(w.layer_ids) * w.hidden * 2,
    }


# -- routing: exact, by trainer/distributed/routing.py on RankLayout
@dataclass(frozen=True)
class Routes:
    T: int
    D: int
    pairs: int  # distinct (target rank, drafter rank) pairs that ever exchange a batch
    cross: float  # fraction of batches whose target and drafter are on different nodes


def routes(nodes: int, routing: str = "fixed") -> Routes:
    """The batches' routes as the ranks compute them (trainer/distributed/routing.py `route`,
    ranks to nodes by RankLayout). Both rules repeat every lcm(T, D, D * t) batches: exact."""
    from trainer.distributed.layout import RankLayout
    from trainer.distributed.routing import crosses_nodes, route

    T, D = nodes * T_PER_NODE, nodes * D_PER_NODE
    lay = RankLayout(0, T + D, 0, T, D, "auto", nodes, routing)
    period = math.lcm(T, D, D * T_PER_NODE)
    pairs, cross = set(), 0
    for i in range(period):
        way = route(i, lay)
        pairs.add((lay.target_rank(way.target), lay.drafter_rank(way.replica)))
        cross += crosses_nodes(i, lay)
    return Routes(T, D, len(pairs), cross / period)


# -- the model of a step -----------------------------------------------------------------
@dataclass(frozen=True)
class PerGpu:
    target_s: float  # one batch's target forward on a GPU of its own
    drafter_s: float  # one batch's drafter fwd+bwd+AdamW (+ clip), sustained, no all_reduce


def per_gpu(w: Workload, w8: Workload, m: Measured) -> PerGpu:
    # Target: the 8-layer harness scaled to the kept layers (62 of 64).
    target = m.hybrid_packed_ms / 1e3 * w.kept_layers / m.hybrid_layers
    # Drafter: the 8B drafter's measured sustained step, scaled by the analytic FLOPs.
    assert abs(w8.flops - m.drafter_8b_flops) < 1e-6 * m.drafter_8b_flops, "FLOP model moved"
    return PerGpu(target, m.drafter_8b_sustained_s * w.flops / w8.flops)


def ring_s(D: int, nbytes: float, gbytes_s: float) -> float:
    return 2 * (D - 1) / D * nbytes / (gbytes_s * GiB) if D > 1 else 0.0


def fmt(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def render() -> str:
    m = measured()
    w = workload(CONFIG_27B, target_info_27b())
    w8 = workload(CONFIG_8B, target_info_8b())
    g = per_gpu(w, w8, m)
    msg = message_bytes(w)
    batch_bytes = sum(msg.values())
    tok = w.seq * w.batch
    per_tok = batch_bytes / tok
    grad = w.trainable * w.grad_bytes
    grad8 = w8.trainable * w8.grad_bytes
    tgt_rate, dft_rate = tok / g.target_s, tok / g.drafter_s
    out: list[str] = []

    out += ["### 1. Inputs", ""]
    gloo_ms = m.opt_processes_ms - m.opt_threads_ms
    out += table(
        ["input", "value", "kind", "source"],
        [
            [
                "target layers read",
                ", ".join(map(str, w.layer_ids)),
                "derived",
                "`default_target_layer_ids(64, 5)` (trainer/targets/load.py); the toml sets none",
            ],
            [
                "target hidden size",
                fmt(w.hidden),
                "from the repo",
                "bench/make_bench_target_qwen36.py `TEXT` (published config, quoted)",
            ],
            ["tokens a batch", f"{w.batch} × {w.seq}", "config", CONFIG_27B.name],
            [
                "drafter trainable parameters",
                f"{w.trainable / 1e9:.3f} B",
                "derived",
                "`DFlashDrafter` built on the meta device"
                " (trainer/model/drafter.py, setup.drafter_arch)",
            ],
            [
                "gradient dtype in the all_reduce",
                f"fp{8 * w.grad_bytes}",
                "derived",
                "fp32 master weights; distributed/pipeline `_average_grads` flattens `p.grad`",
            ],
            [
                "hybrid forward, 8 layers, packed, fla",
                f"{m.hybrid_packed_ms} ms",
                "measured",
                f"{HYBRID_LOG.relative_to(ROOT)} (H200, 2026-12-01)",
            ],
            [
                "27B config, every role on one H200",
                f"{fmt(m.launch_27b_tok_s)} tok/s",
                "measured",
                f"{LAUNCH_27B_LOG.relative_to(ROOT)} (through `dflash-tui launch`)",
            ],
            [
                "8B drafter step alone, sustained / burst",
                f"{m.drafter_8b_sustained_s * 1e3:.1f} / {m.drafter_8b_burst_s * 1e3:.1f} ms",
                "measured",
                "bench/results.json `stage_drafter_sustained_s`, `drafter_compiled_layers_s`",
            ],
            [
                "8B target forward alone, sustained",
                f"{m.target_8b_sustained_s * 1e3:.1f} ms",
                "measured",
                "bench/results.json `stage_target_sustained_s`",
            ],
            [
                "8B optimizer stage, threads / processes (gloo)",
                f"{m.opt_threads_ms:.1f} / {m.opt_processes_ms:.1f} ms",
                "measured",
                "medians of `stages_ms` over the window, bench/results-workloads/h200-modes-*",
            ],
            [
                "the seeds' run, 8 GPUs 5:3",
                f"{fmt(m.seeds_tok_s)} tok/s",
                "measured (by them)",
                SEEDS_LOG.relative_to(ROOT).as_posix(),
            ],
            [NVLINK.name, f"{NVLINK.gbytes_s:.0f} GB/s", "assumed", NVLINK.scope],
            *[
                [k.name, f"{k.gbytes_s:g} GB/s (theory {PCIE_THEORY:g})", "assumed", k.scope]
                for k in PCIE
            ],
            *[
                [k.name, f"{k.gbytes_s:g} GB/s ({k.gbytes_s * 8:g} Gbit/s)", "assumed", k.scope]
                for k in LINKS
            ],
        ],
    )

    out += ["", "### 2. One batch on the wire (four messages, trainer/distributed/transfer.py)", ""]
    rows = [[k, fmt(v), f"{v / tok:,.1f}"] for k, v in msg.items()]
    rows.append(["**total**", f"**{fmt(batch_bytes)}**", f"**{per_tok:,.1f}**"])
    out += table(["message", "bytes a batch", "bytes a token"], rows)
    out += [
        "",
        f"Features = {tok} tokens × {len(w.layer_ids)} layers × {w.hidden} × 2 B (bf16); "
        f"{msg['features'] / batch_bytes:.1%} of the batch.",
    ]

    out += ["", "### 3. One GPU per role: rates and the 5 : 3 balance", ""]
    node_t, node_d = T_PER_NODE * tgt_rate, D_PER_NODE * dft_rate
    best = max(range(1, 8), key=lambda t: min(t * tgt_rate, (8 - t) * dft_rate))
    out += table(
        ["figure", "value", "kind", "how"],
        [
            [
                "target forward, a batch",
                f"{g.target_s * 1e3:.0f} ms ({fmt(tgt_rate)} tok/s)",
                "derived",
                f"{m.hybrid_packed_ms} ms × {w.kept_layers}/{m.hybrid_layers} layers "
                f"({w.kept_linear} Gated DeltaNet + {w.kept_layers - w.kept_linear} full attention "
                "kept; the harness has the same 3 : 1 mix)",
            ],
            [
                "drafter step, a batch (no all_reduce)",
                f"{g.drafter_s * 1e3:.0f} ms ({fmt(dft_rate)} tok/s)",
                "derived",
                f"8B's {m.drafter_8b_sustained_s * 1e3:.1f} ms × FLOPs {w.flops / 1e12:.1f} / "
                f"{w8.flops / 1e12:.1f} T (`gpu_bench.drafter_flops`)",
            ],
            [
                "check: both on one GPU",
                f"{(g.target_s + g.drafter_s) * 1e3:.0f} ms of work vs "
                f"{tok / m.launch_27b_tok_s * 1e3:.0f} ms a batch measured",
                "measured vs derived",
                "the one-GPU launch overlaps the two on separate streams (GPU 89 % busy)",
            ],
            ["a node's targets (5)", f"{fmt(node_t)} tok/s", "derived", "5 × target rate"],
            [
                "a node's drafters (3), before the all_reduce",
                f"{fmt(node_d)} tok/s",
                "derived",
                "3 × drafter rate",
            ],
            [
                "best split of 8 GPUs",
                f"{best} : {8 - best}",
                "derived",
                "max over t of min(t × target, (8 − t) × drafter)",
            ],
            [
                "the seeds' node",
                f"{fmt(m.seeds_tok_s)} tok/s "
                f"= {m.seeds_tok_s / min(node_t, node_d):.0%} of the derived node",
                "measured",
                "",
            ],
        ],
    )

    out += [
        "",
        "### 4. Feature transfer by node count (`runtime.routing`: fixed g % T → g % D, and node)",
        "",
    ]
    rows = []
    node_rate = min(node_t, node_d)
    for n in NODE_COUNTS:
        r, local = routes(n, "fixed"), routes(n, "node")
        egress = node_rate * per_tok * r.cross  # bytes/s leaving a node
        rows.append(
            [
                str(n),
                f"{r.T} : {r.D}",
                f"{r.pairs} / {local.pairs}",
                f"{r.cross:.1%}",
                f"{local.cross:.1%}",
                f"{node_rate * per_tok / GiB:.2f}",
                f"{egress / GiB:.2f} ({egress * 8 / GiB:.1f})",
                f"{egress / (LINKS[1].gbytes_s * GiB):.1%}",
                f"{egress / (LINKS[3].gbytes_s * GiB):.1%}",
            ]
        )
    out += table(
        [
            "nodes",
            "T : D",
            "target→drafter pairs, fixed / node",
            "batches crossing nodes, fixed (before)",
            "node (after)",
            "features made a node, GB/s",
            "leaving a node with fixed, GB/s (Gbit/s)",
            "of one 400G NIC",
            "of 100G Ethernet",
        ],
        rows,
    )
    out += [
        "",
        f"At {fmt(node_rate)} tok/s a node (section 3's slower side, the drafters). "
        "The shares are counted over whole periods of the ranks' own routing function; "
        '`runtime.routing = "node"` leaves nothing to leave a node (table 6 shows fixed).',
    ]

    out += ["", "### 5. The drafters' gradient all_reduce, once per optimizer step", ""]
    rows = []
    for n in NODE_COUNTS:
        D = n * D_PER_NODE
        if n == 1:  # the drafters' ring stays on the node
            cells = [f"{ring_s(D, grad, NVLINK.gbytes_s) * 1e3:,.0f}"] + ["—"] * len(LINKS)
        else:
            cells = ["—"] + [f"{ring_s(D, grad, k.gbytes_s) * 1e3:,.0f}" for k in LINKS]
        rows.append([str(n), str(D), f"{2 * (D - 1) / D * grad / GiB:.2f}", *cells])
    out += table(
        ["nodes", "D", "ring traffic a rank, GB"]
        + [f"ms, {k.name} ({k.gbytes_s:g} GB/s)" for k in [NVLINK, *LINKS]],
        rows,
    )
    out += [
        "",
        f"Gradient: {w.trainable / 1e9:.3f} B × {w.grad_bytes} B = {grad / GiB:.2f} GB "
        f"a step; ring time = 2(D−1)/D × bytes / bandwidth; the bandwidth "
        f"is one ring's slowest hop. Against the drafter's "
        f"{g.drafter_s * 1e3:.0f} ms of compute a step. Measured on one H200 (8B config, "
        f"D = 1, gloo through host memory): the optimizer stage grows from "
        f"{m.opt_threads_ms:.1f} to {m.opt_processes_ms:.1f} ms (+{gloo_ms:.0f} ms) for "
        f"{grad8 / GiB:.2f} GB of fp32 gradient, an all_reduce over one rank.",
    ]

    out += [
        "",
        "### 6. Where the first bottleneck appears (tok/s a node; the job = nodes × it)",
        "",
    ]
    rows = []
    for n in NODE_COUNTS:
        r = routes(n)
        D = n * D_PER_NODE
        links = [NVLINK] if n == 1 else LINKS
        for k in links:
            ar = ring_s(D, grad, k.gbytes_s)
            drafters = D_PER_NODE * tok / (g.drafter_s + ar)
            if n == 1:
                feat_bw, feat = T_PER_NODE * NVLINK.gbytes_s * GiB, math.inf
            else:
                feat_bw = FEATURE_NICS_PER_GPU * GiB if k is LINKS[0] else k.gbytes_s * GiB
                feat = feat_bw / (per_tok * r.cross)
            caps = {
                "target compute": node_t,
                "drafter step + all_reduce": drafters,
                "feature transfer": feat,
            }
            first = min(caps, key=lambda c: caps[c])
            rate = caps[first]
            # One NIC a node carries both: the link's busy share at that rate.
            step_s = D_PER_NODE * tok / rate
            busy = (rate * per_tok * r.cross + 2 * (D - 1) / D * grad / step_s) / (k.gbytes_s * GiB)
            rows.append(
                [
                    str(n),
                    k.name,
                    fmt(node_t),
                    fmt(drafters),
                    "intra-node" if n == 1 else f"{feat / 1e6:,.1f}M",
                    f"**{first}**",
                    f"{ar / (g.drafter_s + ar):.0%}",
                    fmt(rate),
                    f"{rate / min(node_t, node_d):.0%}",
                    f"{fmt(n * rate / 1e3, 1)}K",
                    "—" if n == 1 or k is LINKS[0] else f"{busy:.0%}",
                ]
            )
    out += table(
        [
            "nodes",
            "link",
            "targets",
            "drafters + all_reduce",
            "features",
            "first bottleneck",
            "all_reduce share of a step",
            "a node",
            "vs no communication",
            "job",
            "one NIC busy",
        ],
        rows,
    )
    out += pcie_section(w, g, grad)
    return "\n".join(out) + "\n"


def pcie_section(w: Workload, g: PerGpu, grad: int) -> list[str]:
    """One node of the operators' PCIe box, 5 : 3: the drafters' gradient all_reduce in fp32
    (as trained today) and in bf16 (half the bytes), against the drafter's step."""
    D = D_PER_NODE
    out = ["", f"### 7. The operators' box: {PCIE_BOX}, one node, 5 : 3", ""]
    rows = []
    for dtype, nbytes in (("fp32", grad), ("bf16", grad // 2)):
        for k in PCIE:
            ar = ring_s(D, nbytes, k.gbytes_s)
            rows.append(
                [
                    dtype,
                    f"{nbytes / GiB:.2f}",
                    f"{2 * (D - 1) / D * nbytes / GiB:.2f}",
                    f"{k.name} ({k.gbytes_s:g} GB/s)",
                    f"{ar * 1e3:,.0f}",
                    f"{ar / g.drafter_s:.0%}",
                    f"{ar / (g.drafter_s + ar):.0%}",
                    fmt(D * w.seq * w.batch / (g.drafter_s + ar)),
                ]
            )
    out += table(
        [
            "gradient",
            "GB a step",
            "ring traffic a rank, GB",
            "link (assumed)",
            "all_reduce, ms",
            "vs the step",
            "share of a step, not overlapped",
            "the node's drafters, tok/s",
        ],
        rows,
    )
    out += [
        "",
        f"Against the {g.drafter_s * 1e3:.0f} ms drafter step of section 3 (derived for an"
        " H200; an RTX PRO 6000's own step is not measured). The link speeds are assumed"
        f" (PCIe 5.0 x16: {PCIE_THEORY:g} GB/s a direction in theory); no PCIe box was lent.",
    ]
    return out


def splice(doc: str, tables: str) -> str:
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{tables}{END}{tail}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if SCALING.md's tables differ")
    p.add_argument("--print", action="store_true", help="print the tables, write nothing")
    a = p.parse_args()
    tables = render()
    if a.print:
        print(tables, end="")
        return 0
    doc = DOC.read_text()
    want = splice(doc, tables)
    if a.check:
        if want != doc:
            print(f"{DOC.relative_to(ROOT)}: tables differ from bench/scaling.py's; run it")
            return 1
        return 0
    DOC.write_text(want)
    print(tables, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
