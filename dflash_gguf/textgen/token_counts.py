"""How often the target writes each token: greedy responses to training prompts, through the native layer.

drafter/draft_vocab.py chooses a reduced draft vocabulary from these counts. The prompts default to the first
training prompt set we ship (corpus.prompts.FIRST_PROMPTS), never the evaluation prompts.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import numpy as np

from ..corpus.prompts import FIRST_PROMPTS, load
from ..target_file import TargetFile


def load_prompt_rows(files: list[Path]) -> list[dict]:
    rows = [r for f in files or [FIRST_PROMPTS] for r in load(Path(f))]
    random.Random(0).shuffle(rows)          # a mix of categories whatever the budget
    return rows


def count_target_tokens(target: TargetFile, rows: list[dict], max_new: int = 128, seconds: float | None = None,
                        n_threads: int = 0) -> np.ndarray:
    """Counts [n_vocab] of the tokens in the target's greedy responses to `rows` (or as many as `seconds`
    allow), through the target's shared model."""
    from ..native.wrappers import Batch, Context, ContextSettings  # noqa: PLC0415
    from .greedy import greedy_continuation  # noqa: PLC0415
    from .prompting import format_prompt  # noqa: PLC0415
    model = target.model()
    ctx = Context(model, ContextSettings(n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=n_threads))
    batch = Batch(model.native, 512)
    counts = np.zeros(model.n_vocab, np.int64)
    t0, done = time.monotonic(), 0
    try:
        for row in rows:
            if seconds is not None and time.monotonic() - t0 > seconds:
                break
            out = greedy_continuation(model, ctx, batch, format_prompt(model, row)[:1024 - max_new], max_new)
            np.add.at(counts, out, 1)
            done += 1
    finally:
        batch.close()
        ctx.close()
    print(f"draft vocabulary: counted {int(counts.sum())} tokens of the target's responses to {done} prompts "
          f"({(counts > 0).sum()} distinct)", file=sys.stderr)
    return counts

