"""Plain greedy decoding and one-pass tapped features, through the native layer."""

from __future__ import annotations

import numpy as np


def greedy_continuation(model, ctx, batch, prompt: list[int], max_new: int) -> list[int]:
    """The target's greedy continuation of `prompt` (plain decoding, no taps)."""
    ctx.set_taps([])
    ctx.clear()
    for i in range(0, len(prompt), 512):
        chunk = prompt[i:i + 512]
        batch.set_tokens(chunk, i, "last")
        ctx.decode(batch, "prefill")
    out = []
    while len(out) < max_new:
        tok = int(np.argmax(ctx.logits(-1)))
        out.append(tok)
        if model.is_eog(tok):
            break
        batch.set_tokens([tok], len(prompt) + len(out) - 1, "last")
        ctx.decode(batch, "decode")
    return out


def prefill_features(ctx, batch, taps: list[int], seq: list[int]) -> np.ndarray:
    """Tapped target features [len(seq), k*H] of every position of `seq` (one batched prefill pass)."""
    ctx.set_taps(taps)
    ctx.clear()
    parts = []
    for i in range(0, len(seq), 512):
        chunk = seq[i:i + 512]
        batch.set_tokens(chunk, i, ctx.outputs_for_taps("last"))
        ctx.decode(batch, "features")
        parts.append(ctx.get_taps(0, len(chunk)))
    return np.concatenate(parts)
