"""DFlash2 draft source: DFlash plus a top-K candidate selector walked from the verified anchor (z-lab).

The pinned dflash graph (src/models/dflash.cpp, build_dflash2_selector) packs, for every block row i >= 1,
a "lattice" row into the nextn output: `[cand_i (K ids as floats), S_i (K×K)]` with
S_i[j, c] = unary_i[c] + ⟨A[cand_{i-1}[j]] ⊙ P(h_i), B[cand_i[c]]⟩ — the edge score from candidate j of the
previous slot (row 1: the anchor token, all K rows equal) to candidate c of this slot; unary_i is the
slot's logit of the candidate (after logit scale / soft-capping). The walk runs here, like upstream's
common/speculative.cpp:
- T = 0: from the anchor, take the best-scoring successor of the previous pick at each slot;
- T > 0 (rejection mode): the loop's sampler draws each slot's token from the transformed edge scores
  (a vocab row, -inf outside the K candidates) given the token drawn before; that q is what verification
  divides by, so the output distribution stays the target's.
"""

from __future__ import annotations

import numpy as np

from ...gguf_family import DFLASH2
from .base import Proposal
from .dflash import DFlashSource


class DFlash2Source(DFlashSource):
    member = DFLASH2.name
    rates_by_probability = False              # its selector walk drafts; it rates no slots
    reads_draft_vocab_rows = False            # its selector reads the vocabulary's rows

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.top_k = int(self.model.meta("dflash.selector_top_k"))
        self.ctx.enable_nextn()

    def rate_slots(self) -> bool:
        return False

    def lattice(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """(candidates [rows, K] int, scores [rows, K, K] [slot, predecessor, successor]) of the last draft
        decode; row 0 (the anchor) is empty."""
        K = self.top_k
        packed = self.ctx.nextn_rows(rows)
        cand = packed[:, :K].astype(np.int64)
        scores = np.array(packed[:, K:K + K * K]).reshape(rows, K, K)
        return cand, scores

    def draft(self, last_token: int, pos: int, n: int, want_logits: bool, pick=None) -> Proposal:
        rows = self._decode_block(last_token, pos, n + 1)
        cand, scores = self.lattice(rows)
        self.driver.drop_block(pos)
        tokens, qs, pred = [], [], 0
        for i in range(1, n + 1):
            edge = scores[i, pred]                                      # [K] scores of this slot's candidates
            if pick is None:
                pred = int(np.argmax(edge))
                tokens.append(int(cand[i, pred]))
                continue
            row = np.full(self.n_vocab, -np.inf, dtype=np.float32)
            row[cand[i]] = edge
            token, q = pick(row)
            pred = int(np.flatnonzero(cand[i] == token)[0])
            tokens.append(int(token))
            qs.append(q)
        return Proposal(tokens, None, np.stack(qs) if qs else None)
