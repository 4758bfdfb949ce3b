"""The DFlash family in GGUF terms: one `Member` per drafter design, which convert, the validator, train and the
engine dispatch on.

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

from dataclasses import dataclass, field
from typing import Callable, Mapping

# tensors that must stay F32: ggml adds the conv base to F32 coefficients
F32_ONLY = ("_conv_base",)


def _none(*args, **kwargs) -> dict:
    return {}


@dataclass(frozen=True, eq=False)          # one object per member: compared and hashed by identity
class Member:
    name: str
    marker: str | None = None           # the tensor that makes a file this member (load_arch_tensors)
    part: str = ""                      # what the marker belongs to, as messages name it
    setting: str | None = None          # the DrafterConfig field (and HF config key) only this member sets
    settings: tuple[str, ...] = ()      # its DrafterConfig fields, in the order `inspect` reports them
    # its GGUF keys "dflash.{key}" (= DrafterConfig fields) → int (uint32, all required with the marker) or bool
    keys: Mapping[str, type] = field(default_factory=dict)
    defaults: Mapping[str, object] = field(default_factory=dict)   # settings a file may leave out (upstream's)
    vocab_tensor: str | None = None     # a tensor whose last ne spans the vocabulary (for a file without tokenizer)
    draft_vocab: bool = True            # convert can give it a reduced draft vocabulary (d2t)
    # GGUF name → ne of every tensor it adds: (n_embd, n_layer, n_vocab, settings, n_draft_vocab)
    shapes: Callable[..., dict] = _none
    problems: Callable[[int, Mapping], list[str]] = lambda n_embd, s: []   # why llama.cpp would refuse its settings
    from_tensors: Callable[[Mapping], dict] = _none    # settings its tensors carry (name → ne), and file-only facts
    optional: tuple[str, ...] = ()      # tensors of `shapes` a GGUF may leave out (checked when present)

    def int_keys(self) -> tuple[str, ...]:
        return tuple(k for k, kind in self.keys.items() if kind is int)

    def bool_keys(self) -> tuple[str, ...]:
        return tuple(k for k, kind in self.keys.items() if kind is bool)


_DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def _dflash2_problems(n_embd: int, s: Mapping) -> list[str]:
    kernel, group, rank, top_k = (s.get(k) or 0 for k in _DFLASH2_KEYS)
    problems = [f"{k} = {v} must be >= 1" for k, v in zip(_DFLASH2_KEYS, (kernel, group, rank, top_k)) if v < 1]
    if problems:
        return problems
    if n_embd % group:
        problems.append(f"hidden size {n_embd} is not divisible by conv_group_size {group}")
    if n_embd < top_k * (top_k + 1):
        problems.append(f"hidden size {n_embd} is too small for a selector lattice of top-k {top_k} "
                        f"(needs >= {top_k * (top_k + 1)})")
    return problems


def _dflash2_shapes(n_embd: int, n_layer: int, n_vocab: int, s: Mapping, n_draft_vocab: int | None = None) -> dict:
    kernel, rank = s["conv_kernel_size"], s["selector_rank"]
    projected = 2 * kernel * (n_embd // s["conv_group_size"])     # in- and out-side δ per group and tap
    n_vocab = n_draft_vocab or n_vocab
    out = {"selector_predecessor.weight": (rank, n_vocab), "selector_successor.weight": (rank, n_vocab),
           "selector_hidden.weight": (n_embd, rank)}
    for i in range(n_layer):
        for side in ("attn", "ffn"):
            out[f"blk.{i}.{side}_conv_base"] = (n_embd, kernel, 2)
            out[f"blk.{i}.{side}_conv_proj.weight"] = (n_embd, projected)
    return out


def _dspark_shapes(n_embd: int, n_layer: int, n_vocab: int, s: Mapping, n_draft_vocab: int | None = None) -> dict:
    """Optional tensors only when present (`confidence_head`, `w2_scale`). W1 is indexed by the previous token,
    any target token (the anchor, or a d2t-mapped argmax), so it spans the whole vocabulary; W2 gives the bias of
    each head row, so it spans the draft vocabulary when there is one (`d2t`)."""
    rank = s["markov_rank"]
    out = {"markov_w1.weight": (rank, n_vocab), "markov_w2.weight": (rank, n_draft_vocab or n_vocab)}
    if s.get("w2_scale"):
        out["markov_w2.scale"] = (1,)
    if s.get("confidence_head"):
        out |= {"conf_proj.weight": (n_embd + rank, 1), "conf_proj.bias": (1,)}
    return out


DFLASH = Member("DFlash")
DFLASH2 = Member("DFlash2", marker="selector_hidden.weight", part="selector tensors", setting="selector_rank",
                 settings=_DFLASH2_KEYS, keys=dict.fromkeys(_DFLASH2_KEYS, int),
                 vocab_tensor="selector_successor.weight", draft_vocab=False,
                 shapes=_dflash2_shapes, problems=_dflash2_problems)
DSPARK = Member("DSpark", marker="markov_w1.weight", part="Markov head", setting="markov_rank",
                settings=("markov_rank", "confidence_head", "sample_from_anchor"), keys={"sample_from_anchor": bool},
                defaults={"sample_from_anchor": True}, vocab_tensor="markov_w1.weight", shapes=_dspark_shapes,
                from_tensors=lambda ne: {"markov_rank": int(ne["markov_w1.weight"][0]),
                                         "confidence_head": "conf_proj.weight" in ne,
                                         "w2_scale": "markov_w2.scale" in ne},
                optional=("conf_proj.bias",))
MEMBERS = (DFLASH, DFLASH2, DSPARK)


def member_of(tensor_names) -> Member:
    """The family member a drafter with these tensors is (raises ValueError when it claims two)."""
    found = [m for m in MEMBERS if m.marker in tensor_names]
    if len(found) > 1:
        raise ValueError("it has both a DFlash2 selector and a DSpark Markov head; no member of the family has both")
    return found[0] if found else DFLASH


def squeeze(ne) -> tuple[int, ...]:
    """ne without trailing 1s (writers differ in whether they keep them)."""
    ne = list(ne)
    while len(ne) > 1 and ne[-1] == 1:
        ne.pop()
    return tuple(ne)
