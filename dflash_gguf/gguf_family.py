"""The DFlash family in GGUF terms: which member a `dflash` file is, and the keys and tensor shapes each adds.

All three share the architecture `dflash` (upstream llama.cpp, src/models/dflash.cpp); upstream tells them
apart by optional tensors, not by a version key, and so do we:

  member    marker tensor             adds to the DFlash backbone (fc + hidden_norm, injected K/V, one block)
  DFlash    -                         -
  DFlash2   selector_hidden.weight    per layer a dynamic depthwise causal conv around attention and MLP
                                      (blk.N.{attn,ffn}_conv_base, blk.N.{attn,ffn}_conv_proj.weight) and a
                                      top-K candidate selector (selector_{predecessor,successor,hidden}.weight);
                                      keys dflash.conv_kernel_size / conv_group_size / selector_rank / selector_top_k
  DSpark    markov_w1.weight          a low-rank Markov head (markov_w1/markov_w2(.scale)) chained over the slots,
                                      an optional confidence head (conf_proj.weight/.bias); key
                                      dflash.sample_from_anchor (absent = true: row 0 predicts the first draft)

Shapes are ggml `ne` (innermost first), exactly what `create_tensor` asks for in the pinned tree.
"""

from __future__ import annotations

DFLASH, DFLASH2, DSPARK = "DFlash", "DFlash2", "DSpark"
MEMBERS = (DFLASH, DFLASH2, DSPARK)
# marker tensor → member (llama_model_dflash::load_arch_tensors)
MARKERS = {"selector_hidden.weight": DFLASH2, "markov_w1.weight": DSPARK}
# DFlash2 keys, each "dflash.{key}", all required once the selector is present (load_arch_tensors throws)
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
SAMPLE_FROM_ANCHOR_KEY = "dflash.sample_from_anchor"
# tensors that must stay F32: ggml adds the conv base to F32 coefficients
F32_ONLY = ("_conv_base",)


def member_of(tensor_names) -> str:
    """The family member a drafter with these tensors is (raises ValueError when it claims two)."""
    found = {member for marker, member in MARKERS.items() if marker in tensor_names}
    if len(found) > 1:
        raise ValueError("it has both a DFlash2 selector and a DSpark Markov head; no member of the family has both")
    return found.pop() if found else DFLASH


def dflash2_problems(n_embd: int, kernel: int, group: int, rank: int, top_k: int) -> list[str]:
    """Why llama.cpp would refuse these DFlash2 settings (load_arch_tensors), empty when it loads them."""
    problems = [f"{k} = {v} must be >= 1" for k, v in zip(DFLASH2_KEYS, (kernel, group, rank, top_k)) if v < 1]
    if problems:
        return problems
    if n_embd % group:
        problems.append(f"hidden size {n_embd} is not divisible by conv_group_size {group}")
    if n_embd < top_k * (top_k + 1):
        problems.append(f"hidden size {n_embd} is too small for a selector lattice of top-k {top_k} "
                        f"(needs >= {top_k * (top_k + 1)})")
    return problems


def dflash2_shapes(n_embd: int, n_vocab: int, n_layer: int, kernel: int, group: int, rank: int) -> dict:
    """GGUF name → ne of every tensor DFlash2 adds."""
    projected = 2 * kernel * (n_embd // group)          # in- and out-side δ per group and tap
    out = {"selector_predecessor.weight": (rank, n_vocab), "selector_successor.weight": (rank, n_vocab),
           "selector_hidden.weight": (n_embd, rank)}
    for i in range(n_layer):
        for side in ("attn", "ffn"):
            out[f"blk.{i}.{side}_conv_base"] = (n_embd, kernel, 2)
            out[f"blk.{i}.{side}_conv_proj.weight"] = (n_embd, projected)
    return out


def dspark_shapes(n_embd: int, n_vocab: int, rank: int, confidence: bool, w2_scale: bool = False,
                  n_draft_vocab: int | None = None) -> dict:
    """GGUF name → ne of every tensor DSpark adds (optional ones only when present). W1 is indexed by the
    previous token, any target token (the anchor, or a d2t-mapped argmax), so it spans the whole vocabulary;
    W2 gives the bias of each head row, so it spans the draft vocabulary when there is one (`d2t`)."""
    out = {"markov_w1.weight": (rank, n_vocab), "markov_w2.weight": (rank, n_draft_vocab or n_vocab)}
    if w2_scale:
        out["markov_w2.scale"] = (1,)
    if confidence:
        out |= {"conf_proj.weight": (n_embd + rank, 1), "conf_proj.bias": (1,)}
    return out


def squeeze(ne) -> tuple[int, ...]:
    """ne without trailing 1s (writers differ in whether they keep them)."""
    ne = list(ne)
    while len(ne) > 1 and ne[-1] == 1:
        ne.pop()
    return tuple(ne)
