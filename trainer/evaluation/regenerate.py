"""The target's own answers as training data: a drafter is accepted only where it says what
the target would say, so it should learn from what the target says.

    python -m trainer regenerate --config CFG --out FILE.jsonl [--max-new-tokens 128]
                                 [--device cuda:0] [--batch 64] [--limit N] [--set k=v ...]

Each sample of the config's data is cut at its first loss token (the conversation before
the answer, trainer/targets/answers.py's `prompt_of`), and the whole target answers it
greedily (with its KV cache). The output is one JSON line per prompt in the `tokens` format
(`input_ids` = prompt + answer, `loss_mask` 0 on the prompt and 1 on the answer), which
`data.path` takes as it is: no re-tokenization can change a token. Prompts of one length go
together, so no padding can change an answer. Written beside the output and renamed into
place; an existing file is never replaced.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from trainer.config import Config
from trainer.evaluation.acceptance import load_for_decoding
from trainer.evaluation.export import ExportError
from trainer.targets.answers import AnswerError, write_answers


def regenerate(
    cfg: Config,
    out: Path,
    max_new: int = 128,
    device: str = "cpu",
    batch: int = 64,
    limit: int | None = None,
    prompt_len: int = 1024,
    say: Any = print,
) -> dict[str, Any]:
    t0 = time.monotonic()
    if out.exists() or out.is_symlink():
        raise ExportError(
            f"{out}: already exists; regenerate never overwrites (choose a new --out)"
        )
    if not out.parent.is_dir():
        raise ExportError(f"{out.parent}: no such folder for --out")
    dec = load_for_decoding(cfg, device, "regenerate")
    try:
        done = write_answers(dec, out, max_new, batch, limit, prompt_len, say, cfg.data.path)
    except AnswerError as e:
        raise ExportError(str(e)) from None
    return {**done, "seconds": round(time.monotonic() - t0, 1)}
