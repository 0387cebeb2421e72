"""Control operations over the link: deploy, launch, kill, restart, dump stacks, clear cache.

Each is one agent command; the agent does the work next to the trainer (its own process
group, locks, signals), so nothing here builds a remote shell string.
"""

from __future__ import annotations

import base64
import io
import tarfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trainer
from dflash_tui.link.bundle import agent_blob
from dflash_tui.link.link import Link
from trainer.contract.codehash import code_hash

TRAINER_DIR = Path(trainer.__file__).resolve().parent
Progress = Callable[[dict[str, Any]], None]


class ControlError(Exception):
    pass


def _trainer_files() -> list[Path]:
    keep = {".py", ".toml", ".jsonl"}
    return sorted(
        p
        for p in TRAINER_DIR.rglob("*")
        if p.is_file() and p.suffix in keep and "__pycache__" not in p.parts
    )


def build_bundle() -> tuple[bytes, str, int]:
    """(tar.gz bytes, code sha256, file count): trainer/, the agent, and pynvml if we have it."""
    buf = io.BytesIO()
    count = 0
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in _trainer_files():
            tar.add(path, arcname=f"trainer/{path.relative_to(TRAINER_DIR).as_posix()}")
            count += 1
        # The same script the link runs, so a launched run's wrapper speaks this contract.
        agent = agent_blob()
        info = tarfile.TarInfo("dflash_agent.py")
        info.size, info.mode, info.mtime = len(agent), 0o644, int(time.time())
        tar.addfile(info, io.BytesIO(agent))
        count += 1
        try:
            import pynvml  # the pure-Python NVML binding: the container needs nothing else

            tar.add(Path(pynvml.__file__), arcname="_vendor/pynvml.py")
            count += 1
        except ImportError:
            pass
    return buf.getvalue(), code_hash(TRAINER_DIR), count


async def deploy(link: Link, on_progress: Progress | None = None) -> dict[str, Any]:
    blob, sha, count = build_bundle()
    data = await link.request(
        {"cmd": "deploy", "tar_b64": base64.b64encode(blob).decode(), "sha256": sha},
        timeout=120,
        on_progress=on_progress,
    )
    data["files"] = count
    return data


def read_config(path: Path) -> tuple[str, str]:
    """(TOML text, run name), checked here so a typo fails before anything is shipped."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ControlError(f"--config {path}: no such file") from None
    except OSError as e:
        raise ControlError(f"--config {path}: {e.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ControlError(f"--config {path}: {e}") from None
    name = data.get("name")
    return text, name if isinstance(name, str) else path.stem


def check_overrides(overrides: list[str]) -> list[str]:
    for o in overrides:
        if "=" not in o or "\n" in o:
            raise ControlError(f"--set {o!r}: expected one key=value")
    return overrides


async def launch(
    link: Link, config: Path, overrides: list[str], on_progress: Progress | None = None
) -> dict[str, Any]:
    text, name = read_config(config)
    return await link.request(
        {
            "cmd": "launch",
            "config_toml": text,
            "overrides": check_overrides(overrides),
            "name": name,
        },
        timeout=120,
        on_progress=on_progress,
    )


async def _stop(
    link: Link,
    cmd: str,
    timeout_s: float,
    drain_timeout_s: float,
    on_progress: Progress | None,
    run_id: str | None,
    extra_s: float,
) -> dict[str, Any]:
    return await link.request(
        {"cmd": cmd, "run_id": run_id, "timeout_s": timeout_s, "drain_timeout_s": drain_timeout_s},
        timeout=timeout_s + drain_timeout_s + extra_s,
        on_progress=on_progress,
    )


async def kill(
    link: Link,
    timeout_s: float = 60,
    drain_timeout_s: float = 120,
    on_progress: Progress | None = None,
    run_id: str | None = None,
) -> dict[str, Any]:
    return await _stop(link, "kill", timeout_s, drain_timeout_s, on_progress, run_id, 30)


async def restart(
    link: Link,
    timeout_s: float = 60,
    drain_timeout_s: float = 120,
    on_progress: Progress | None = None,
    run_id: str | None = None,
) -> dict[str, Any]:
    # A restart also waits for the new run's first heartbeat.
    return await _stop(link, "restart", timeout_s, drain_timeout_s, on_progress, run_id, 150)


async def dump_stacks(link: Link, pyspy: bool = True, run_id: str | None = None) -> dict[str, Any]:
    return await link.request({"cmd": "dump_stacks", "run_id": run_id, "pyspy": pyspy}, timeout=60)


async def clear_cache(link: Link) -> dict[str, Any]:
    return await link.request({"cmd": "clear_compile_cache"}, timeout=120)


async def list_runs(link: Link, store: Any) -> list[dict[str, Any]]:
    await link.request({"cmd": "list_runs"}, timeout=60)
    return list(store.runs)
