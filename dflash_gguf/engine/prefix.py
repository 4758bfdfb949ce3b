"""The sequence an engine holds between generations: reuse its longest common prefix, or snapshot it to RAM.

After a generation the target holds the prompt and every token it decoded (`Target.tokens`; the newest
emitted token is never decoded), and the drafter holds the same positions as injected features (some may
still be pending in its buffer). The next prompt shares a prefix with that sequence — a chat's history —
so both are cut back to the prefix (`Target.truncate`, `DFlashSource.truncate`: seq_rm of the positions
after it) and only the rest is prefilled: `SpecDecoder.generate(..., n_cached=k)`.

Exactness: with our CPU build (patches/0012 for attention, ggml-kernels/cpu for the matmuls) a position's KV
depends only on its tokens: every ubatch width computes each row in the same order, so the positions a generation
decoded in verify batches are what a prefill computes, and the next turn reuses all of them
(`Target.width_invariant`): a follow-up sent at once waits for nothing. Where the order depends on the width
(ggml's stock paths: DFLASH_CPU_ISA=none, flash attention off, a GPU) a position's KV depends on one property of
the ubatch it was decoded in: wide (>= 64 rows: stock flash attention runs tiled) or narrow (target.WIDE_ROWS).
Generated tokens are decoded narrow, a long prompt wide. So `keep_prefix` keeps only the positions a cold prefill
of the new prompt would compute the same way (`Target.reusable`), the prefill of the rest gives each position the
class a cold prefill gives it (`Target._chunks`), and `widen` re-decodes a finished generation's narrow positions
wide while the server is idle, as a prefill of the next turn will want them; it yields to a request that arrives
meanwhile (which prefills what is left, if it continues the conversation). KV cache types the tiled kernel does
not take (`-ctk q8_0 -ctv q8_0`) are width-invariant there too. Measured on SmolLM2-135M Q4_1 with stock
attention: a 30-row and a 1-row last ubatch change the last logits by up to 0.7 against one 700-row prefill;
600+100 or 7x100 rows give the same bits; with ours every split gives the same bits (tests/test_kv_cache_types.py).
Greedy output with a reused prefix equals a cold start (tests/test_prefix_cache.py). At least one prompt token is
always decoded again: its logits pick the first new token.

Where a prefix cannot be kept, `keep_prefix` returns 0 and the generation starts cold:
- a recurrent (hybrid) target rolls its state back only within a verify (n_rs_seq snapshots or one
  checkpoint): it cannot be cut back to a shorter prefix, nor re-decode its generated positions wide, so after a
  generation nothing of it is reused (no recurrent-state checkpoints are kept along a conversation);
- a drafter with a sliding window (--draft-ctx) that has dropped positions;
- a drafter left behind by plain decoding (`Engine.generate(speculative=False)` does not feed it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from .target import WIDE_ROWS

# widen's ubatch, all a request that arrives meanwhile waits for. Re-decoding 384 rows after 1,300 positions took
# the same in ubatches of 64, 128 or 384 rows within the noise (4.4-6.1 s, SmolLM2 Q4_1, 1 thread, loaded 2-core EPYC)
WIDEN_ROWS = 64


@dataclass
class SequenceSnapshot:
    """One held sequence, copied out of the contexts (llama_state_seq_get_data): a conversation in RAM."""
    tokens: list[int]
    wide: list[bool]                      # Target.wide of each position
    target: bytes                         # the target's KV cache (and recurrent state) of sequence 0
    drafter: bytes | None                 # the drafter's context K/V, pending rows injected first

    @property
    def nbytes(self) -> int:
        return len(self.target) + len(self.drafter or b"") + 5 * len(self.tokens)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def keep_prefix(target, drafter, prompt: Sequence[int]) -> int:
    """Cut target and drafter back to their longest common prefix with `prompt`, leaving at least one prompt
    token to decode; returns its length (0: nothing reusable, the next generation starts cold)."""
    k = target.reusable(min(common_prefix(target.tokens, prompt), len(prompt) - 1), len(prompt))
    if k <= 0 or not target.truncate(k):
        return 0
    if drafter is not None and not drafter.truncate(k):
        return 0
    return k


def widen(target, drafter, should_stop: Callable[[], bool] = lambda: False) -> int:
    """Re-decode the held positions decoded narrow (a generation's) in wide ubatches, feeding the drafter the new
    features, so that a longer prompt reuses them exactly; returns how many positions were decoded again.

    `should_stop` is asked before the first ubatch and between ubatches of WIDEN_ROWS: when it says a request
    waits, the sequence is left at once, cut back to the positions decoded so far (the narrow ones after them
    were computed over the narrow versions of these: no prefill of any prompt computes them so). A request that
    continues the conversation prefills the rest itself, wide as a cold prefill makes it."""
    n = target.n_past
    first = next((i for i, w in enumerate(target.wide) if not w), n)
    start = min(first, n - WIDE_ROWS)
    if first == n or start < 0 or target.recurrent or should_stop():
        return 0
    if drafter is not None and not drafter.truncate(start):
        return 0                                  # a sliding-window drafter that dropped positions: leave it
    tokens = target.tokens[start:n]
    if not target.truncate(start):
        raise RuntimeError(f"{target.model.path.name}: cannot remove positions >= {start} to decode them again")
    sink = drafter.process if drafter is not None else None
    done = 0
    while done < len(tokens):
        rest = len(tokens) - done
        size = WIDEN_ROWS if rest >= WIDEN_ROWS + WIDE_ROWS else rest      # the last ubatch is wide too
        target.prefill(tokens[done:done + size], sink, all_wide=True)
        done += size
        if done < len(tokens) and should_stop():
            break
    return done


def snapshot(target, drafter) -> SequenceSnapshot:
    data = None
    if drafter is not None:
        drafter.flush()
        data = drafter.ctx.state_get(partial=False)
    return SequenceSnapshot(list(target.tokens), list(target.wide), target.ctx.state_get(partial=False), data)


def restore(target, drafter, snap: SequenceSnapshot) -> None:
    """Put a snapshot back into the (cleared) contexts; the engine then holds its sequence."""
    target.reset()
    target.ctx.state_set(snap.target, partial=False)
    target.n_past, target.tokens, target.wide = len(snap.tokens), list(snap.tokens), list(snap.wide)
    if drafter is not None:
        drafter.begin()
        if snap.drafter is not None:
            drafter.ctx.state_set(snap.drafter, partial=False)
