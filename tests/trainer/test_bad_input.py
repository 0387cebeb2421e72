"""Bad config and data, through the real `python -m trainer` (issue 11).

Every invalid value is refused before any heavy work (data, models, compile) with exit 2 and
one stderr line naming the key, the value and the rule; malformed data lines, however
pathological, are skipped, counted and named by file and line. The generated tests check
the validator in-process (fast) and a few of its refusals through the real CLI.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_trainer_cli import run_trainer

from trainer.config import (
    RULES,
    Config,
    ConfigError,
    apply_overrides,
    check_target_fit,
    load_config,
)
from trainer.data.samples import DataError, load_samples
from trainer.targets.load import default_target_layer_ids

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "trainer" / "configs" / "tiny-cpu.toml"
CHAT = (ROOT / "trainer" / "datasets" / "synthetic-chat.jsonl").read_text().splitlines()


def trainer(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_trainer(*args, timeout=timeout)


def the_one_line(r: subprocess.CompletedProcess[str]) -> str:
    """The refusal: exit 2, exactly one stderr line, no traceback anywhere."""
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:], r.stdout[-2000:])
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr + r.stdout
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def phases_visited(root: Path) -> list[str]:
    """The phases of the run dir under root, if the refusal came after it was made."""
    dirs = [p for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
    if not dirs:
        return []
    (run_dir,) = dirs
    hb = json.loads((run_dir / "heartbeat.json").read_text())
    return [v["phase"] for v in hb["phase_history"]] + [hb["phase"]]


# -- files and folders for the cases ------------------------------------------------------------
def _binary(tmp: Path) -> str:
    (tmp / "model.bin").write_bytes(bytes(range(256)) * 8)
    return str(tmp / "model.bin")


def _resume_with(tmp: Path, text: str) -> str:
    run = tmp / "old-run"
    run.mkdir()
    (run / "config.json").write_text(text)
    return str(run)


def _file(tmp: Path, name: str = "taken", text: str = "a file\n") -> str:
    (tmp / name).write_text(text)
    return str(tmp / name)


class TinyTarget:
    """builtin:tiny-qwen3's shape, as check_target_fit reads it."""

    num_layers, num_heads, num_kv_heads, head_dim = 8, 4, 2, 32
    vocab_size, max_positions = 512, 4096


# (id, CLI arguments given tmp, what the line must contain). `{tmp}` is the test's folder.
CASES: list[tuple[str, Any, list[str]]] = [
    # The config file itself.
    ("binary-config", lambda t: ["--config", _binary(t)], ["config: file", "model.bin", "UTF-8"]),
    ("dir-config", lambda t: ["--config", str(t)], ["config: file", "a folder, not a regular"]),
    ("missing-config", lambda t: ["--config", str(t / "no.toml")], ["no.toml", "not found"]),
    (
        "not-toml",
        lambda t: ["--config", _file(t, "c.toml", "[train\nlr = 1\n")],
        ["c.toml", "not TOML"],
    ),
    # --resume, --run-dir, --run-root.
    (
        "resume-config-not-object",
        lambda t: ["--resume", _resume_with(t, "[1, 2]")],
        ["config.json", "expected a JSON object, got [1, 2]"],
    ),
    (
        "resume-config-deep",
        lambda t: ["--resume", _resume_with(t, "[" * 100_000)],
        ["config.json is not valid JSON (nested too deep)"],
    ),
    (
        "resume-a-file",
        lambda t: ["--resume", _file(t)],
        ["--resume", "taken", "cannot read config.json"],
    ),
    (
        "run-dir-is-a-file",
        lambda t: ["--config", str(TINY), "--run-dir", _file(t)],
        ["--run-dir", "taken", "exists and is not a directory"],
    ),
    (
        "run-root-is-a-file",
        lambda t: ["--config", str(TINY), "--run-root", _file(t)],
        ["--run-root", "taken"],
    ),
    # Values: each key's own rule.
    ("num_heads", ["--set", "drafter.num_heads=-2"], ["config: drafter.num_heads = -2: must be"]),
    ("head_dim", ["--set", "drafter.head_dim=-1"], ["config: drafter.head_dim = -1: must be"]),
    ("block_size", ["--set", "drafter.block_size=100000"], ["drafter.block_size = 100000"]),
    ("lr-inf", ["--set", "train.lr=inf"], ["config: train.lr = inf: must be a finite number"]),
    ("lr-nan", ["--set", "train.lr=nan"], ["config: train.lr = nan: must be a finite number"]),
    ("epochs", ["--set", "train.epochs=-1"], ["config: train.epochs = -1: must be a positive"]),
    ("max-steps", ["--max-steps", "-5"], ["config: train.max_steps = -5: must be"]),
    ("grad_clip", ["--set", "train.grad_clip=-1"], ["config: train.grad_clip = -1: must be"]),
    ("warmup", ["--set", "train.warmup_steps=-1"], ["config: train.warmup_steps = -1: must"]),
    ("bool-as-int", ["--set", "train.batch_size=true"], ["train.batch_size = true: expected"]),
    ("min_lr_ratio", ["--set", "train.min_lr_ratio=1.5"], ["min_lr_ratio = 1.5: must be in"]),
    ("beta", ["--set", "train.betas=[0.9, 1.5]"], ["train.betas[1] = 1.5: must be in [0, 1)"]),
    ("seed-huge", ["--set", "train.seed=18446744073709551616"], ["must fit in a 64-bit"]),
    ("tree-nodes", ["--set", "eval.tree_nodes=-1"], ["config: eval.tree_nodes = -1: must be 0"]),
    ("tree-nodes-huge", ["--set", "eval.tree_nodes=5000"], ["eval.tree_nodes = 5000: must be"]),
    ("unknown-key", ["--set", "train.lrr=1"], ["train.lrr = 1: unknown key (did you mean"]),
    ("max-steps-word", ["--max-steps", "abc"], ["--max-steps", "'abc'"]),
    (
        "packed-attention-choice",
        ["--set", "target.packed_attention=flash"],
        ['config: target.packed_attention = "flash": expected one of auto, varlen, mask'],
    ),
    (
        "varlen-on-cpu",
        ["--set", "target.packed_attention=varlen"],
        ["target.packed_attention: 'varlen': varlen attention needs CUDA"],
    ),
    (
        "cuda-graphs-choice",
        ["--set", "eval.cuda_graphs=true"],
        ["config: eval.cuda_graphs = true: expected one of auto, on, off"],
    ),
    (
        "cuda-graphs-on-cpu",
        ["--set", "eval.cuda_graphs=on"],
        [
            'config: eval.cuda_graphs = "on": CUDA graphs need a CUDA device (the eval runs on'
            " cpu); use 'auto' or 'off'"
        ],
    ),
    (
        "node-routing-in-threads-mode",
        ["--set", "runtime.routing=node"],
        ['config: runtime.routing = "node": needs runtime.mode = "processes"'],
    ),
    (
        "compile-cache-on-a-file",
        lambda t: ["--set", f"runtime.compile_cache_dir={json.dumps(_file(t))}"],
        ["runtime.compile_cache_dir", "taken", "cannot create the folder"],
    ),
    # Against the target's shape (4 heads, 2 key/value heads, 8 layers, 4096 positions):
    # after the run dir is made, before any data is read or model built. More of these
    # in-process below (each process here loads torch and transformers: seconds).
    ("num_heads-vs-kv", ["--set", "drafter.num_heads=3"], ["drafter.num_heads = 3: 3 query"]),
    ("layers", ["--set", "drafter.target_layer_ids=[0, 99]"], ["the target has layers 0..7"]),
]


@pytest.mark.parametrize(("args", "needles"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_before_any_work(
    tmp_path: Path, tiny_target_dir: Path, args: Any, needles: list[str]
) -> None:
    if callable(args):
        args = args(tmp_path)
    config = [] if "--config" in args or "--resume" in args else ["--config", str(TINY)]
    root = tmp_path / "runs"
    run_root = [] if "--run-root" in args else ["--run-root", str(root)]
    line = the_one_line(trainer(*config, *run_root, *args))
    for needle in needles:
        assert needle in line, line
    # Refused before any heavy work: no data read, no model built, nothing compiled.
    assert not {"loading_data", "compiling", "warmup", "training"} & set(phases_visited(root))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["drafter.num_heads=3"],
            "config: drafter.num_heads = 3: 3 query heads must be a multiple",
        ),
        (["drafter.num_kv_heads=3"], "config: drafter.num_kv_heads = 3: 4 query heads must"),
        (["drafter.target_layer_ids=[0, 8]"], "= [0, 8]: the target has layers 0..7"),
        (
            ["drafter.num_layers=20"],
            "config: drafter.num_layers = 20: too many for DFlash's default",
        ),
        (["data.seq_buckets=[64, 9000]"], "= [64, 9000]: 9000 is beyond the target's 4096"),
        (["drafter.num_layers=7"], "drafter.num_layers = 7: too many for DFlash's default spread"),
    ],
)
def test_what_does_not_fit_the_target_is_one_line(overrides: list[str], message: str) -> None:
    cfg = load_config(TINY, overrides)
    with pytest.raises(ConfigError) as e:
        spread = default_target_layer_ids(TinyTarget.num_layers, cfg.drafter.num_layers)
        check_target_fit(cfg, TinyTarget(), spread)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_every_number_in_the_config_has_a_rule() -> None:
    """A numeric key added without a rule fails here (its bad values would reach the run)."""
    missing = []
    for section in dataclasses.fields(Config):
        table = getattr(Config(), section.name)
        if not dataclasses.is_dataclass(table):
            continue  # name
        for key, hint in typing.get_type_hints(type(table)).items():
            full = f"{section.name}.{key}"
            item = typing.get_args(hint)[0] if typing.get_origin(hint) is list else None
            if hint in (int, float) and full not in RULES:
                missing.append(full)
            if item in (int, float) and f"{full}[]" not in RULES:
                missing.append(f"{full}[]")
    assert missing == []


# -- data -------------------------------------------------------------------------------------
PATHOLOGICAL: list[tuple[bytes, str]] = [
    (b"[" * 100_000, "invalid JSON (nested too deep)"),
    (b'{"text": ' + b"7" * 5000 + b"}", "invalid JSON (a number too long)"),
    (b'{"text": "caf\xe9 \xff"}', "invalid UTF-8"),
    (b'{"text": "a\x00b"}', "invalid JSON"),
    (b'{"text": "lone \\ud800 surrogate"}', "the tokenizer refused the text (TypeError)"),
    (b"\x00\x00\x00", "invalid JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b"null", "not a JSON object"),
    (b'"just a string"', "not a JSON object"),
    (b"{}", "no 'conversations', 'text' or 'input_ids' key"),
    (b'{"text": 7}', "empty text"),
    (b'{"conversations": {"role": "user"}}', "'conversations' is not a non-empty list"),
    (b'{"conversations": [{"role": ' + b"[" * 50_000 + b"]", "invalid JSON (nested too deep)"),
    (b'{"input_ids": [-1, 99999999]}', "'loss_mask' is not a list as long as 'input_ids'"),
    (b"x" * 3_000_000, "invalid JSON"),  # a giant line
]


def _messy_file(path: Path) -> tuple[Path, list[int]]:
    """Good chat lines with every pathological line between them; the bad lines' numbers."""
    lines: list[bytes] = []
    bad_numbers = []
    for i, (bad, _) in enumerate(PATHOLOGICAL):
        lines.append(CHAT[i].encode())
        lines.append(bad)
        bad_numbers.append(len(lines))
    lines += [line.encode() for line in CHAT[len(PATHOLOGICAL) : 40]]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path, bad_numbers


def test_pathological_lines_are_skipped_counted_and_named(tmp_path: Path, tiny_tokenizer) -> None:
    path, numbers = _messy_file(tmp_path / "data.jsonl")
    warnings: list[str] = []
    _, report = load_samples(path, tiny_tokenizer, warn=warnings.append, vocab_size=10**6)
    assert report.skipped == len(PATHOLOGICAL) and report.samples == 40
    expected = [
        f"data: {path}:{n}: skipped ({why})"
        for n, (_, why) in zip(numbers, PATHOLOGICAL, strict=True)
    ]
    assert warnings[:-1] == expected
    assert warnings[-1].startswith(f"data: {path}: skipped {len(PATHOLOGICAL)} of 55 lines (")


def test_tokens_lines_are_checked_like_any_other(tmp_path: Path, tiny_tokenizer) -> None:
    """The `tokens` format (`python -m trainer regenerate` writes it) is input too."""
    path = tmp_path / "data.jsonl"
    lines = [
        b'{"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}',
        b'{"input_ids": [-1, 9], "loss_mask": [0, 1]}',
        b'{"input_ids": [1, true], "loss_mask": [0, 1]}',
        b'{"input_ids": [1, 2], "loss_mask": [0, 2]}',
        b'{"input_ids": [], "loss_mask": []}',
        b'{"input_ids": [1, 2, 3], "loss_mask": [0, 1]}',
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    warnings: list[str] = []
    samples, report = load_samples(path, tiny_tokenizer, warn=warnings.append, vocab_size=1000)
    assert [s.input_ids for s in samples] == [[5, 6, 7]] and samples[0].loss_mask == [0, 1, 1]
    assert warnings[:-1] == [
        f"data: {path}:2: skipped (token id -1 outside the target's vocabulary (1000))",
        f"data: {path}:3: skipped ('input_ids' holds something other than integers)",
        f"data: {path}:4: skipped ('loss_mask' holds something other than 0 and 1)",
        f"data: {path}:5: skipped ('input_ids' is not a non-empty list)",
        f"data: {path}:6: skipped ('loss_mask' is not a list as long as 'input_ids')",
    ]
    assert report.skipped == 5


def test_token_ids_outside_the_targets_vocabulary_are_skipped(tmp_path: Path, tiny_tokenizer):
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"text": "a b c"}) + "\n" + CHAT[0] + "\n")
    ids = tiny_tokenizer("a b c")["input_ids"]
    vocab = max(ids)  # the text's largest id is one past this vocabulary
    warnings: list[str] = []
    with pytest.raises(DataError):  # the chat line has larger ids still: nothing usable
        load_samples(path, tiny_tokenizer, warn=warnings.append, vocab_size=vocab)
    assert warnings[0] == (
        f"data: {path}:1: skipped (token id {max(ids)} outside the target's vocabulary ({vocab}))"
    )


def test_a_run_on_pathological_data_trains_and_reports_what_it_skipped(tmp_path: Path) -> None:
    path, numbers = _messy_file(tmp_path / "data.jsonl")
    root = tmp_path / "runs"
    r = trainer(
        "--config",
        str(TINY),
        "--run-root",
        str(root),
        "--max-steps",
        "2",
        "--set",
        f"data.path={json.dumps(str(path))}",
        "--set",
        "runtime.targets=['cpu']",
        "--set",
        "runtime.drafters=['cpu']",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stdout + r.stderr
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]  # not the launch lock
    log = (run_dir / "train.log").read_text()
    assert f"data: {path}:{numbers[0]}: skipped (invalid JSON (nested too deep))" in log
    assert f"data: {path}:{numbers[1]}: skipped (invalid JSON (a number too long))" in log
    assert f"data: {path}: skipped {len(PATHOLOGICAL)} of 55 lines" in log
    assert "finished at step 2" in log


def test_a_file_of_only_bad_lines_is_one_line(tmp_path: Path, tiny_target_dir: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(bad for bad, _ in PATHOLOGICAL[:6]) + b"\n")
    line = the_one_line(
        trainer(
            "--config",
            str(TINY),
            "--run-root",
            str(tmp_path / "runs"),
            "--set",
            f"data.path={json.dumps(str(path))}",
        )
    )
    assert str(path) in line and "no usable sample" in line and "6 lines, 6 skipped" in line


# -- generated configs -------------------------------------------------------------------------
KEYS = [
    f"{section.name}.{f.name}"
    for section in dataclasses.fields(Config)
    if dataclasses.is_dataclass(getattr(Config(), section.name))
    for f in dataclasses.fields(getattr(Config(), section.name))
]
SCALARS = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-3, max_value=300),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-2, max_value=2),
    st.booleans(),
    st.text(max_size=12),
    st.sampled_from(["auto", "cpu", "cuda:0", "sdpa", "fused", "builtin:tiny-qwen3", ""]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else {math.inf: "inf", -math.inf: "-inf"}.get(v, repr(v))
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"


@st.composite
def config_texts(draw: st.DrawFn) -> str:
    """A TOML config: real keys mostly, with any values; now and then an unknown key."""
    sections: dict[str, dict[str, Any]] = {}
    for _ in range(draw(st.integers(0, 6))):
        key = draw(
            st.sampled_from(KEYS) | st.from_regex(r"[a-z]{1,6}\.[a-z_]{1,8}", fullmatch=True)
        )
        section, name = key.split(".", 1)
        sections.setdefault(section, {})[name] = draw(VALUES)
    body = "".join(
        f"[{s}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in keys.items())
        for s, keys in sections.items()
    )
    return draw(st.sampled_from(["", "name = 'x'\n"])) + body


def validate_or_refuse(path: Path) -> Config | None:
    """The property: a config loads and fits the target, or it is one ConfigError line."""
    try:
        cfg = load_config(path)
        n = cfg.drafter.num_layers
        spread = default_target_layer_ids(TinyTarget.num_layers, n) if n <= 8 else []
        check_target_fit(cfg, TinyTarget(), spread)
    except ConfigError as e:
        message = str(e)
        assert message.startswith("config: ") and "\n" not in message and len(message) < 400
        assert message.isprintable()  # values and keys are escaped
        return None
    return cfg


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(text=config_texts())
def test_generated_configs_load_or_are_refused_in_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "generated.toml"
    path.write_text(text)
    validate_or_refuse(path)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(key=st.sampled_from(KEYS), raw=st.text(max_size=30) | st.builds(toml_value, VALUES))
def test_generated_overrides_apply_or_are_refused_in_one_line(key: str, raw: str) -> None:
    try:
        apply_overrides(load_config(TINY), [f"{key}={raw}"])
    except ConfigError as e:
        assert str(e).startswith("config: ") and "\n" not in str(e)


@settings(
    max_examples=4,  # real processes: a handful, whatever the profile
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    deadline=None,
)
@given(text=config_texts())
def test_generated_refusals_are_the_same_line_through_the_cli(tmp_path: Path, text: str) -> None:
    path = tmp_path / "generated.toml"
    path.write_text(text)
    try:
        load_config(path)
    except ConfigError as e:
        expected = f"error: {e}"
    else:
        assume(False)  # an accepted config would train: the in-process test covers those
    run_root = tmp_path / "runs"
    assert the_one_line(trainer("--config", str(path), "--run-root", str(run_root))) == expected
    assert not run_root.exists() or not list(run_root.iterdir())


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(lines=st.lists(st.binary(max_size=60) | st.builds(toml_value, VALUES).map(str.encode)))
def test_generated_data_lines_are_samples_or_skipped(tmp_path: Path, tiny_tokenizer, lines):
    path = tmp_path / "generated.jsonl"
    path.write_bytes(b"\n".join([*lines, CHAT[0].encode()]))
    warnings: list[str] = []
    samples, report = load_samples(path, tiny_tokenizer, warn=warnings.append, vocab_size=10**6)
    assert report.samples == len(samples) >= 1
    assert report.lines == report.samples + report.skipped
    assert all("\n" not in w and "\r" not in w for w in warnings)
