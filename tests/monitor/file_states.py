"""What can stand at a path a user names (a config, a known_hosts file), as hypothesis
strategies: bytes, TOML of any types, nothing, a folder, a FIFO, a device, a file past the
size caps, a symlink to any of these. `make(state, path)` puts one there for real."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

DEVICES = ["/dev/null", "/dev/zero", "/dev/urandom", "/dev/full"]
# Past every cap (config.toml 1 MiB, launch --config 1 MiB, trainer 4 MiB): a sparse file.
HUGE = 5 << 20


def toml_value(v: Any) -> str:
    """A Python value as TOML (strings as JSON, which TOML reads, or refuses when a lone
    surrogate is escaped: a refusal is a case too)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return (
            "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
        )
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"


VALUES = st.recursive(
    st.none().map(lambda _: "")
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from(["ssh://[h", "user@[host", "ssh://a]b", "local", "~/x", "123", "a\nb"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
TARGET_KEYS = [
    "target", "pct", "exec_prefix", "remote_dir", "run_root", "python", "identity",
    "known_hosts", "theme", "baseline_tok_s", "hosts", "master", "other",
]  # fmt: skip


@st.composite
def config_tomls(draw: st.DrawFn) -> str:
    """A config.toml (or a trainer config) whose tables and keys hold values of any type."""
    lines = []
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(["baseline_tok_s", "name", "targets", "groups", "train"]))
        lines.append(f"{key} = {toml_value(draw(VALUES))}")
    for _ in range(draw(st.integers(0, 3))):
        section = draw(st.sampled_from(["targets", "groups", "train", "data"]))
        name = draw(st.sampled_from(["a", "b", "local", "gpu-box"]))
        lines.append(f"[{section}.{json.dumps(name)}]")
        for key in draw(st.lists(st.sampled_from(TARGET_KEYS), max_size=4, unique=True)):
            lines.append(f"{key} = {toml_value(draw(VALUES))}")
    return "\n".join(lines) + "\n"


LEAVES = st.one_of(
    st.tuples(st.just("bytes"), st.binary(max_size=600)),
    st.tuples(st.just("toml"), config_tomls()),
    st.tuples(st.just("missing")),
    st.tuples(st.just("folder")),
    st.tuples(st.just("fifo")),
    st.tuples(st.just("device"), st.sampled_from(DEVICES)),
    st.tuples(st.just("huge")),
)
FILE_STATES = LEAVES | st.tuples(st.just("symlink"), LEAVES)


def make(state: tuple, path: Path) -> None:
    """Put `state` at `path` (its folder exists; nothing is at `path` yet)."""
    kind = state[0]
    if kind == "bytes":
        path.write_bytes(state[1])
    elif kind == "toml":
        path.write_text(state[1], encoding="utf-8", errors="surrogatepass")
    elif kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to(state[1])  # a device cannot be made here; a link to one is the same
    elif kind == "huge":
        with open(path, "wb") as f:
            f.truncate(HUGE)
    elif kind == "symlink":
        make(state[1], path.with_name(path.name + ".real"))
        path.symlink_to(path.name + ".real")


def regular_text(state: tuple) -> bool:
    """Whether `state` is a regular file of UTF-8 text within every cap (only then may a
    reader accept it)."""
    if state[0] == "symlink":
        return regular_text(state[1])
    if state[0] == "toml":
        try:
            state[1].encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if state[0] == "bytes":
        try:
            state[1].decode("utf-8")
        except UnicodeDecodeError:
            return False
        return True
    return False


def absent(state: tuple) -> bool:
    """Nothing there: no file, or a symlink to none (read as no file, as OpenSSH does)."""
    return state == ("missing",) or (state[0] == "symlink" and absent(state[1]))
