"""PyTorch reference of DFlash2 (z-lab) and DSpark (DeepSeek DeepSpec): what each adds to the DFlash backbone.

Written from z-lab dflash `dflash/model.py` (GroupedDynamicCausalConv, CandidateSelector, DFlash2DraftModel)
and DeepSpec `deepspec/modeling/dspark/{qwen3/modeling,markov_head,common}.py` (vanilla Markov head,
confidence head); the parity reference for llama.cpp's `dflash` graph (src/models/dflash.cpp:
build_dflash2_conv, build_dflash2_selector, build_dspark_markov_head) in tests/test_family_parity.py. Train builds
DFlash and DSpark drafters from drafter/torch_ref.py alone; only the parity tests need DFlash2's layers.
Parameter names are the checkpoints' (z-lab: the codebooks carry no ".weight"), so `load_state_dict` takes
what `convert.checkpoint_formats.read_source` reads from a published folder.

Shapes: S block rows (row 0 the anchor), n draft rows, H hidden, k taps, G = H / group_size, K top-k,
r rank, V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dflash_gguf.drafter.config import DrafterConfig
from dflash_gguf.drafter.torch_ref import DecoderLayer, DFlashDrafter


# --- DFlash2 -------------------------------------------------------------------------------------------

def grouped_dynamic_conv(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, group_size: int) -> torch.Tensor:
    """Depthwise causal convolution along the block with a kernel per row and channel:
    out[i, c] = Σ_t (base[t, c] + delta[i, t, c // group_size]) · x[i − t, c], and x[j < 0] = 0: the taps
    never reach across the block start (the anchor row sees only itself).
    x [B, S, H], delta [B, S, k, G], base [k, H] → [B, S, H]."""
    S, k = x.shape[1], base.shape[0]
    out = torch.zeros_like(x)
    for t in range(min(k, S)):
        shifted = F.pad(x[:, :S - t], (0, 0, t, 0))                                   # row i holds x[i - t]
        weight = base[t] + delta[:, :, t].repeat_interleave(group_size, dim=-1)        # [B, S, H]
        out = out + weight * shifted
    return out


class GroupedDynamicCausalConv(nn.Module):
    """One kernel projection of the normed sublayer input gives the deltas of both convolutions: the in-side
    one (on the sublayer's input) and the out-side one (on its output). A fresh module is the identity."""

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size, self.group_size = kernel_size, group_size
        base = torch.zeros(2, kernel_size, hidden_size)                       # [side (in, out), k, H]
        base[:, 0] = 1.0
        self.base_kernel = nn.Parameter(base)
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * (hidden_size // group_size), bias=False)
        nn.init.zeros_(self.kernel_projection.weight)

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the in-side convolution of x, the out-side delta [B, S, k, G] for `finish`)."""
        B, S, H = x.shape
        delta = self.kernel_projection(x).view(B, S, 2, self.kernel_size, H // self.group_size)
        return grouped_dynamic_conv(x, delta[:, :, 0], self.base_kernel[0], self.group_size), delta[:, :, 1]

    def finish(self, y: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return grouped_dynamic_conv(y, delta, self.base_kernel[1], self.group_size)


class DFlash2DecoderLayer(DecoderLayer):
    """A DFlash layer with a convolution around each sublayer: the block's q/k/v come from the convolved
    normed input; the injected context K/V do not pass through it (they are not block rows)."""

    def __init__(self, c: DrafterConfig):
        super().__init__(c)
        self.attention_conv = GroupedDynamicCausalConv(c.hidden_size, c.conv_kernel_size, c.conv_group_size)
        self.mlp_conv = GroupedDynamicCausalConv(c.hidden_size, c.conv_kernel_size, c.conv_group_size)

    def forward(self, x, g, block_pos, ctx_pos, mask):
        h, delta = self.attention_conv.prepare(self.input_layernorm(x))
        x = x + self.attention_conv.finish(self.self_attn(h, g, block_pos, ctx_pos, mask), delta)
        h, delta = self.mlp_conv.prepare(self.post_attention_layernorm(x))
        return x + self.mlp_conv.finish(self.mlp(h), delta)


class CandidateSelector(nn.Module):
    """Top-K candidates per slot and the edge score from a predecessor token p to candidate c of slot i:
    unary_i[c] + ⟨A[p] ⊙ P(h_i), B[c]⟩ (A predecessor, B successor codebook [V, r], P hidden projection)."""

    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.top_k = c.selector_top_k
        self.predecessor_codebook = nn.Parameter(torch.zeros(c.vocab_size, c.selector_rank))
        self.successor_codebook = nn.Parameter(torch.zeros(c.vocab_size, c.selector_rank))
        self.hidden_projection = nn.Linear(c.hidden_size, c.selector_rank, bias=False)

    def candidates(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids [n, K], unary [n, K]) of the draft rows' logits [n, V], best first."""
        unary, ids = torch.topk(logits, self.top_k, dim=-1)
        return ids, unary

    def walk(self, hidden: torch.Tensor, logits: torch.Tensor, anchor: int) -> list[int]:
        """The T = 0 draft: from the anchor, the best-scoring candidate given the previous pick, slot by slot.
        hidden [n, H], logits [n, V]: the draft rows (the anchor row excluded)."""
        ids, unary = self.candidates(logits)
        gate = self.hidden_projection(hidden)                                         # [n, r]
        path, prev = [], anchor
        for i in range(hidden.shape[0]):
            score = unary[i] + self.successor_codebook[ids[i]] @ (self.predecessor_codebook[prev] * gate[i])
            prev = int(ids[i, int(score.argmax())])
            path.append(prev)
        return path

    def lattice(self, hidden: torch.Tensor, logits: torch.Tensor, anchor: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids [n, K], scores [n, K, K]) with scores[i, j, c] the edge from candidate j of slot i-1 (slot 0:
        the anchor, every j) to candidate c of slot i: what any walk over these slots can read."""
        ids, unary = self.candidates(logits)
        gate = self.hidden_projection(hidden)                                         # [n, r]
        prev = torch.cat([torch.full((1, self.top_k), anchor, dtype=ids.dtype), ids[:-1]])   # [n, K]
        cond = self.predecessor_codebook[prev] * gate[:, None]                        # [n, K, r]
        scores = torch.einsum("njr,nkr->njk", cond, self.successor_codebook[ids]) + unary[:, None]
        return ids, scores


class DFlash2Drafter(DFlashDrafter):
    """z-lab DFlash2DraftModel: the DFlash backbone with convolved sublayers and a candidate selector."""
    layer_class = DFlash2DecoderLayer

    def __init__(self, config: DrafterConfig):
        super().__init__(config)
        self.candidate_selector = CandidateSelector(config)

    def propose(self, hidden: torch.Tensor, lm_head: torch.Tensor, anchor: int) -> list[int]:
        """hidden [S, H] of one block (row 0 the anchor) → the n = S - 1 greedy draft tokens. The selector
        reads the logits after the logit scale and soft-capping (z-lab compute_logits)."""
        return self.candidate_selector.walk(hidden[1:], self.logits(hidden[1:], lm_head), anchor)


# --- DSpark --------------------------------------------------------------------------------------------

@dataclass
class MarkovChain:
    logits: torch.Tensor                  # [n, V] backbone logits + the Markov bias of each slot's predecessor
    tokens: list[int]                     # the argmax of each row: the greedy draft, and the next predecessor
    confidence: torch.Tensor | None       # [n], or None without a confidence head


class DSparkDrafter(DFlashDrafter):
    """DeepSpec Qwen3DSparkModel at inference: the DFlash backbone, a Markov head chained over the slots on
    argmax tokens, an optional confidence head. Block layouts (config.sample_from_anchor): anchor-first
    (True or None, DeepSpec) drafts from rows 0..S-1, row 0's predecessor the anchor; bonus-anchor (False,
    SpecForge exports as llama.cpp reads them) drafts from rows 1..S-1, row 1's predecessor the anchor."""

    def __init__(self, config: DrafterConfig):
        super().__init__(config, markov_columns=config.vocab_size)      # Markov and confidence heads: markov.py

    @property
    def first_draft_row(self) -> int:
        return 0 if self.config.sample_from_anchor in (True, None) else 1

    def chain(self, hidden: torch.Tensor, lm_head: torch.Tensor, anchor: int) -> MarkovChain:
        """hidden [S, H] of one block → the chained draft rows. The bias adds to the head's raw logits
        (DeepSpec's compute_logits has no output scale)."""
        rows = hidden[self.first_draft_row:]
        logits = self.markov_head.chain(rows @ lm_head.t(), anchor)                   # [n, V]
        tokens = logits.argmax(dim=-1).tolist()
        confidence = None
        if self.confidence_head is not None:
            before = torch.tensor([anchor] + tokens[:-1])
            confidence = self.confidence_head(rows, self.markov_head.markov_w1(before))
        return MarkovChain(logits, tokens, confidence)
