"""DSpark draft source: DFlash plus a low-rank Markov head chained over the slots (DeepSeek DeepSpec).

The pinned dflash graph applies the head itself (src/models/dflash.cpp, build_dspark_markov_head):
slot i's logits are the backbone's plus W2·W1[prev], where prev is the anchor token for the first slot
and the argmax of the previous slot after that. So the logits we read are already the chain's:
- T = 0: their argmax is the DSpark draft;
- T > 0: slot i's distribution depends only on the argmax chain, not on the tokens the loop samples, so
  q_i = transform(logits_i) is exactly the distribution each draft token is drawn from and rejection
  sampling stays lossless (it accepts less often than a chain on the sampled tokens would).

Block layouts (`dflash.sample_from_anchor`): anchor-first (true, DeepSpec; upstream's default when the key
is absent) reads the n drafts from rows 0..n-1 — row i predicts position pos+i+1 — so n drafts need only n
rows; bonus-anchor (false, SpecForge exports) reads rows 1..n like DFlash.
"""

from __future__ import annotations

import numpy as np

from ..gguf_family import DSPARK, SAMPLE_FROM_ANCHOR_KEY
from .drafter import DFlashDrafter, Proposal


class DSparkDrafter(DFlashDrafter):
    member = DSPARK

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.anchor_first = (self.model.meta(SAMPLE_FROM_ANCHOR_KEY) or "true").lower() == "true"

    def draft(self, last_token: int, pos: int, n: int, want_logits: bool, pick=None) -> Proposal:
        first = 0 if self.anchor_first else 1
        # the graph skips the Markov head when the block is longer than the trained block size
        rows = self._decode_block(last_token, pos, max(n + first, 1))
        logits = self.ctx.logits_all(rows)[first:first + n]
        proposal = Proposal([int(t) for t in logits.argmax(axis=1)], np.array(logits) if want_logits else None)
        self.ctx.seq_rm(pos, -1)
        return proposal
