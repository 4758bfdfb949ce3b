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


def prefill_features(ctx, batch, taps: list[int], seq: list[int], logits_at: np.ndarray | None = None,
                     on_logits=None) -> np.ndarray:
    """Tapped target features [len(seq), k*H] of every position of `seq` (one batched prefill pass). With a
    boolean mask `logits_at` [len(seq)], on_logits(positions, logits) gets the logits of those positions, chunk by
    chunk (a view valid during the call)."""
    ctx.set_taps(taps)
    ctx.clear()
    parts = []
    for i in range(0, len(seq), 512):
        chunk = seq[i:i + 512]
        outputs = ctx.outputs_for_taps("last")
        if logits_at is not None and outputs != "all":
            outputs = [bool(x) for x in logits_at[i:i + len(chunk)]]
            outputs[-1] = True                 # the one output row "last" asked for, kept
        batch.set_tokens(chunk, i, outputs)
        ctx.decode(batch, "features")
        parts.append(ctx.get_taps(0, len(chunk)))
        if logits_at is not None:
            rows = np.arange(len(chunk)) if outputs == "all" else np.flatnonzero(outputs)
            logits = ctx.logits_all(len(rows))
            wanted = logits_at[i + rows]
            if wanted.any():
                on_logits(i + rows[wanted], logits[wanted])
    return np.concatenate(parts)
