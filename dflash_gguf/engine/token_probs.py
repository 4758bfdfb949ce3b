"""The target's probabilities for tokens it has just generated (llama-server's `n_probs`), read again.

Speculative steps keep the target's verify rows only as long as verification needs them, so the
distributions behind the emitted tokens are re-read after the generation: the positions that produced
them are decoded again with logits on every row (one prefill-sized pass over the generated tokens), which
leaves the KV cache holding the very same tokens. Probabilities are the plain softmax of the logits, as
llama-server reports them by default (`post_sampling_probs: false`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class TokenProbs:
    token: int
    logprob: float
    top: list[tuple[int, float]]          # (token, logprob), most likely first


def rescore(target, n_prompt: int, generated: list[int], k: int) -> list[TokenProbs] | None:
    """TokenProbs of each generated token (the target holds the prompt and at least generated[:-1]); after it
    the target holds prompt + generated[:-1]. None, with nothing changed, where the target cannot roll back
    (recurrent state)."""
    if not generated:
        return []
    start = n_prompt - 1                      # the last prompt token's row gives the first token's distribution
    inputs = [target.tokens[start]] + generated[:-1]
    if not target.truncate(start):
        return None
    out: list[TokenProbs] = []
    for i in range(0, len(inputs), target.n_batch):
        rows = np.asarray(target.decode_rows(inputs[i:i + target.n_batch]), dtype=np.float64)   # [n, V]
        logp = rows - rows.max(axis=1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
        for j, row in enumerate(logp):
            top = np.argsort(-row, kind="stable")[:k]
            tok = generated[i + j]
            out.append(TokenProbs(tok, float(row[tok]), [(int(t), float(row[t])) for t in top]))
    return out
