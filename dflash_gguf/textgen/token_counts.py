"""How often the target writes each token: greedy responses to training prompts, through the native layer.

convert/draft_vocab.py chooses a reduced draft vocabulary from these counts. The prompts default to the first
training prompt set we ship (corpus.prompts.FIRST_PROMPTS), never the evaluation prompts.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import numpy as np

from ..corpus.prompts import FIRST_PROMPTS, load


def load_prompt_rows(files: list[Path]) -> list[dict]:
    rows = [r for f in files or [FIRST_PROMPTS] for r in load(Path(f))]
    random.Random(0).shuffle(rows)          # a mix of categories whatever the budget
    return rows


def count_target_tokens(target: Path, rows: list[dict], max_new: int = 128, seconds: float | None = None,
                        n_threads: int = 0) -> tuple[np.ndarray, list[int]]:
    """Counts [n_vocab] of the tokens in the target's greedy responses to `rows` (or as many as `seconds`
    allow), and the target's end-of-generation token ids (a draft vocabulary always keeps them)."""
    from ..native.wrappers import Batch, Context, ContextSettings, Model  # noqa: PLC0415
    from .greedy import greedy_continuation  # noqa: PLC0415
    from .prompting import format_prompt  # noqa: PLC0415
    model = Model(target)
    ctx = Context(model, ContextSettings(n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=n_threads))
    batch = Batch(model.native, 512)
    counts = np.zeros(model.n_vocab, np.int64)
    eog = _eog(model)
    t0, done = time.monotonic(), 0
    try:
        for row in rows:
            if seconds is not None and time.monotonic() - t0 > seconds:
                break
            out = greedy_continuation(model, ctx, batch, format_prompt(model, row)[:1024 - max_new], max_new)
            np.add.at(counts, out, 1)
            done += 1
    finally:
        for obj in (batch, ctx, model):
            obj.close()
    print(f"draft vocabulary: counted {int(counts.sum())} tokens of the target's responses to {done} prompts "
          f"({(counts > 0).sum()} distinct)", file=sys.stderr)
    return counts, eog


def _eog(model) -> list[int]:
    return [t for t in range(model.n_vocab) if model.is_eog(t)]


def eog_tokens(target: Path) -> list[int]:
    """The target's end-of-generation token ids."""
    from ..native.wrappers import Model  # noqa: PLC0415
    model = Model(target)
    try:
        return _eog(model)
    finally:
        model.close()
