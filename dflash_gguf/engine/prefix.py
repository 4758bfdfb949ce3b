"""The sequence an engine holds between generations: reuse its longest common prefix, or snapshot it to RAM.

After a generation the target holds the prompt and every token it decoded (`Target.tokens`; the newest
emitted token is never decoded), and the drafter holds the same positions as injected features (some may
still be pending in its buffer). The next prompt shares a prefix with that sequence — a chat's history —
so both are cut back to the prefix (`Target.truncate`, `DFlashDrafter.truncate`: seq_rm of the positions
after it) and only the rest is prefilled: `SpecDecoder.generate(..., n_cached=k)`.

Exactness: the positions kept were computed by the same weights from the same tokens; only the batch they
were decoded in differs (verify batches instead of prefill chunks). On the CPU the kernels give the same bits
for a row whatever the batch (the property that makes speculative == plain there), so greedy output with a
reused prefix equals a cold start (tests/test_prefix_cache.py). At least one prompt token is always decoded
again: its logits pick the first new token.

Where a prefix cannot be kept, `keep_prefix` returns 0 and the generation starts cold:
- a recurrent (hybrid) target rolls its state back only within a verify (n_rs_seq snapshots or one
  checkpoint); it can continue its whole held sequence (a chat's next turn) but not a shorter prefix;
- a drafter with a sliding window (--draft-ctx) that has dropped positions;
- a drafter left behind by plain decoding (`Engine.generate(speculative=False)` does not feed it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass
class SequenceSnapshot:
    """One held sequence, copied out of the contexts (llama_state_seq_get_data): a conversation in RAM."""
    tokens: list[int]
    target: bytes                         # the target's KV cache (and recurrent state) of sequence 0
    drafter: bytes | None                 # the drafter's context K/V, pending rows injected first

    @property
    def nbytes(self) -> int:
        return len(self.target) + len(self.drafter or b"") + 4 * len(self.tokens)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def keep_prefix(target, drafter, prompt: Sequence[int]) -> int:
    """Cut target and drafter back to their longest common prefix with `prompt`, leaving at least one prompt
    token to decode; returns its length (0: nothing reusable, the next generation starts cold)."""
    k = min(common_prefix(target.tokens, prompt), len(prompt) - 1)
    if k <= 0 or not target.truncate(k):
        return 0
    if drafter is not None and not drafter.truncate(k):
        return 0
    return k


def snapshot(target, drafter) -> SequenceSnapshot:
    data = None
    if drafter is not None:
        drafter.flush()
        data = drafter.ctx.state_get(partial=False)
    return SequenceSnapshot(list(target.tokens), target.ctx.state_get(partial=False), data)


def restore(target, drafter, snap: SequenceSnapshot) -> None:
    """Put a snapshot back into the (cleared) contexts; the engine then holds its sequence."""
    target.reset()
    target.ctx.state_set(snap.target, partial=False)
    target.n_past, target.tokens = len(snap.tokens), list(snap.tokens)
    if drafter is not None:
        drafter.begin()
        if snap.drafter is not None:
            drafter.ctx.state_set(snap.drafter, partial=False)
