"""DFlash2 and DSpark: the engine's drafts through llama.cpp's `dflash` graph equal the PyTorch reference
(tests/helpers/torch_ref_family.py, written from z-lab's and DeepSpec's model code) on synthetic checkpoints in the
published config and tensor layout (tests/helpers/family.py), converted by our converter, F32 and q8_0.

Each test injects context features in three rounds and drafts one block after each (the block dropped again
before the next injection, as the engine does) and compares, per round:
- DFlash2: the block logits (after logit scale and soft-capping), the selector lattice the engine reads from the
  nextn rows ([cand_i, S_i (K×K)] per row, aligned by candidate id: ggml's top-k order is its own), and the
  greedy walk the engine proposes against the reference's walk;
- DSpark: the chained logits of the draft rows (the bonus-anchor layout's row 0 unbiased), the drafted tokens,
  and the confidence head's output.
The q8_0 drafters have every DFlash2/DSpark matrix quantized too (rank 64, conv group 4). Their reference reads
the dequantized weights back from the GGUF and rounds each quantized matmul's input as ggml's CPU backend does
(q8_0 blocks): then it is held to the F32 tolerance. Against the unquantized checkpoint (weights and activations
both unrounded) the block rows' argmax and the drafted tokens must agree on most rows.
"""

from __future__ import annotations

import copy
import dataclasses
from contextlib import ExitStack, closing
from dataclasses import dataclass

import gguf
import numpy as np
import pytest

from dflash_gguf.convert.flavours import detect_flavour, normalize_gguf
from dflash_gguf.drafter.tensor_names import gguf_tensor_name
from dflash_gguf.convert.checkpoint_formats import read_source
from dflash_gguf.target_file import TargetFile
from dflash_gguf.convert.writer import write_dflash_gguf
from dflash_gguf.engine.sources import open_drafter
from dflash_gguf.engine.sources.dspark import DSparkSource
from dflash_gguf.gguf_family import DFLASH2
from dflash_gguf.native.wrappers import Context, ContextSettings, Model
from helpers.engine import TINY_DRAFTER, write_tiny_llama
from helpers.family import dflash2_tensors, dspark_tensors, write_dflash2_folder, write_dspark_folder

torch = pytest.importorskip("torch")
from helpers.torch_ref_family import DFlash2Drafter, DSparkDrafter, GroupedDynamicCausalConv  # noqa: E402

# F32 K/V and no flash attention: CPU flash attention rounds Q/K/V to F16 (~1e-2 logit noise)
EXACT = ContextSettings(n_ctx=128, n_batch=64, n_ubatch=64, n_threads=2, type_k="f32", type_v="f32", flash_attn="off")
ROUNDS = (40, 47, 61)          # context rows injected before each draft; the block sits right after them
ANCHORS = (11, 23, 42)         # the verified token each block starts from
# max |llama.cpp − reference| allowed on logits, lattice scores and confidences (measured ≤ 2.5e-5 on a 2-core
# EPYC, F32 and q8_0 with the activation rounding emulated: see docs/dflash-family.md)
TOL = 1e-3
# q8_0 against the unquantized checkpoint: least share of block rows with the same argmax, of equal draft tokens
# (measured: every row, 20/21 and 24/24 tokens; one near tie moved a DFlash2 walk)
ROW_AGREEMENT, TOKEN_AGREEMENT = 0.9, 0.75

DFLASH2_VARIANTS = {
    # the published settings (kernel 2, group 16), tiny rank and top-k
    "f32": dict(kernel=2, group=16, rank=8, top_k=4, outtype="f32"),
    # a longer kernel, and the logit scale and soft-cap the selector's unary scores read
    "f32-kernel3-softcap": dict(kernel=3, group=8, rank=16, top_k=6, outtype="f32",
                                extra={"output_multiplier": 0.5, "final_logit_softcapping": 5.0}),
    "q8_0": dict(kernel=2, group=4, rank=64, top_k=4, outtype="q8_0"),
    # as z-lab ships DFlash2: every layer sliding and is_causal: false, so the sliding layers see the whole block
    # (z-lab also hides keys `window` or more positions ahead; with window >= block size none are)
    "f32-sliding-non-causal": dict(kernel=2, group=16, rank=8, top_k=4, outtype="f32",
                                   config={"sliding_window": 8, "layer_types": ["sliding_attention"] * 2}),
}
DSPARK_VARIANTS = {
    "anchor-first-f32": dict(rank=8, confidence=True, anchor=True, outtype="f32"),
    "bonus-anchor-f32": dict(rank=8, confidence=True, anchor=False, outtype="f32"),
    "no-confidence-f32": dict(rank=8, confidence=False, anchor=None, outtype="f32"),
    "anchor-first-q8_0": dict(rank=64, confidence=True, anchor=True, outtype="q8_0"),
}


@dataclass
class EngineDraft:
    """One round of the engine's drafter, read right after its draft decode."""
    tokens: list[int]                 # what draft() proposed
    logits: np.ndarray                # [S, V] every block row
    lattice: tuple | None             # DFlash2: (cand [S, K], scores [S, K, K]) as the engine reads them
    confidence: np.ndarray | None     # DSpark with a confidence head: [S] (column 0 of the nextn rows)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = write_tiny_llama(tmp_path_factory.mktemp("parity") / "target.gguf", n_vocab=64, n_embd=64, n_layer=3,
                            seed=4)
    t = {x.name: np.array(x.data) for x in gguf.GGUFReader(str(path)).tensors}
    return path, torch.tensor(t["token_embd.weight"]), torch.tensor(t["output.weight"])


@pytest.fixture(scope="module")
def feats():
    return np.random.default_rng(1).standard_normal((max(ROUNDS), len(TINY_DRAFTER.target_layers) * 64)
                                                    ).astype(np.float32)


def _q8_0_rounded(x: torch.Tensor) -> torch.Tensor:
    """x as ggml's CPU backend rounds a matmul's input for a q8_0 weight (quantize_row_q8_0): blocks of 32 along
    the row, d = max|x| / 127 (kept as F16), q = x / d rounded half away from zero, x ≈ q · d."""
    b = x.reshape(-1, 32)
    d = b.abs().amax(1, keepdim=True) / 127
    q = b * torch.where(d > 0, 1 / d, torch.zeros_like(d))
    q = torch.sign(q) * torch.floor(q.abs() + 0.5)
    return (q * d.half().float()).reshape(x.shape)


def _convert(folder, target, out, outtype, *, markov_in_graph=True):
    """(the converted GGUF, the checkpoint's reference, the reference of what llama.cpp runs). For F32 both are
    the checkpoint's; for q8_0 the second holds the weights dequantized back from the file and rounds the input
    of every matmul whose weight is q8_0 there (the embeddings read by row, like the codebooks, are exact), but
    DSpark's W2 only where ggml multiplies by it (the chain in the graph; the engine's numpy chain does not
    round)."""
    tinfo = TargetFile.open(target)
    src = read_source(str(folder), tinfo)
    path = write_dflash_gguf(src.tensors, src.config, target, out, outtype=outtype)
    checkpoint = _reference(src)
    if outtype == "f32":
        return path, checkpoint, checkpoint
    runs = _reference(normalize_gguf(path, detect_flavour(path), tinfo))
    quantized = {t.name for t in gguf.GGUFReader(str(path)).tensors
                 if t.tensor_type == gguf.GGMLQuantizationType.Q8_0}
    hooked = [m.register_forward_pre_hook(lambda _m, args: (_q8_0_rounded(args[0]),))
              for name, m in runs.named_modules()
              if isinstance(m, torch.nn.Linear) and gguf_tensor_name(f"{name}.weight") in quantized
              and (markov_in_graph or not name.startswith("markov"))]
    assert hooked and any(n.startswith(("selector", "markov", "blk.0.attn_conv")) for n in quantized)
    assert markov_in_graph or not any(n.startswith("markov") for n in quantized) or len(hooked) < len(quantized)
    return path, checkpoint, runs


def _reference(src):
    model = (DFlash2Drafter if src.config.member is DFLASH2 else DSparkDrafter)(src.config)
    model.load_state_dict({k: torch.tensor(v) for k, v in src.tensors.items()})    # strict: every name matches
    return model.eval()


def _engine_drafts(target, drafter_path, feats, n, *, confidence=False, markov_in_graph=None) -> list[EngineDraft]:
    """markov_in_graph (DSpark): where the chain runs, None for the engine's choice."""
    out = []
    with ExitStack() as st:
        tm = st.enter_context(closing(Model(target)))
        dm = st.enter_context(closing(Model(drafter_path)))
        tc = st.enter_context(closing(Context(tm, EXACT)))
        drafter = st.enter_context(closing(open_drafter(dm, tc, EXACT, tm) if markov_in_graph is None else
                                           DSparkSource(dm, tc, EXACT, tm, markov_in_graph=markov_in_graph)))
        dspark = isinstance(drafter, DSparkSource)
        if confidence:
            drafter.ctx.enable_nextn()
        rows, done = drafter.block_size, 0
        drafter.begin()
        for end, anchor in zip(ROUNDS, ANCHORS):
            drafter.process(feats[done:end], done)
            done = end
            proposal = drafter.draft(anchor, end, n, want_logits=dspark)
            lattice = tuple(np.array(a) for a in drafter.lattice(rows)) if drafter.member == DFLASH2.name else None
            conf = np.array(drafter.ctx.nextn_rows(rows)[:, 0]) if confidence else None
            logits = np.array(drafter.ctx.logits_all(rows))
            if dspark:                        # the chain's rows (the numpy chain's are not in llama.cpp's buffer)
                logits[rows - n:] = proposal.logits
            out.append(EngineDraft(proposal.tokens, logits, lattice, conf))
    return out


def _block_hidden(model, emb, feats, anchor, n_ctx) -> torch.Tensor:
    """The reference's final-normed hidden states [S, H] of the block [anchor, MASK…] at position n_ctx."""
    c = model.config
    block = [anchor] + [c.mask_token_id] * (c.block_size - 1)
    with torch.no_grad():
        return model(emb[block][None], torch.tensor(feats[:n_ctx])[None],
                     torch.arange(n_ctx, n_ctx + len(block))[None], torch.arange(n_ctx)[None])[0]


def _aligned_scores(ref_ids, ref_scores, cand, scores):
    """The reference's lattice rows in the engine's candidate order ([n, K, K]); asserts equal candidate sets."""
    out, prev_order = [], None
    for i in range(len(cand)):
        assert sorted(cand[i]) == sorted(ref_ids[i]), (i, cand[i], ref_ids[i])
        order = [list(ref_ids[i]).index(c) for c in cand[i]]
        rows = list(range(len(order))) if prev_order is None else prev_order     # slot 1: every row the anchor
        out.append(ref_scores[i][np.ix_(rows, order)])
        prev_order = order
    return np.stack(out)


def _agreement(checkpoint_logits, logits, checkpoint_tokens, tokens) -> tuple[float, float, float]:
    """(max |Δ| of the logits, share of rows with the same argmax, share of equal draft tokens) over all rounds."""
    diff = max(np.abs(a - b).max() for a, b in zip(checkpoint_logits, logits))
    rows = np.mean([a.argmax(1) == b.argmax(1) for a, b in zip(checkpoint_logits, logits)])
    toks = np.mean([a == b for x, y in zip(checkpoint_tokens, tokens) for a, b in zip(x, y)])
    return float(diff), float(rows), float(toks)


@pytest.mark.parametrize("variant", list(DFLASH2_VARIANTS))
def test_dflash2_drafts_match_torch_reference(tmp_path, target, feats, variant):
    v = DFLASH2_VARIANTS[variant]
    target_path, emb, head = target
    config = dataclasses.replace(TINY_DRAFTER, **v.get("config", {}))
    tensors = dflash2_tensors(config, kernel=v["kernel"], group=v["group"], rank=v["rank"], seed=3)
    folder = write_dflash2_folder(tmp_path / "Tiny-DFlash2", config, tensors, kernel=v["kernel"],
                                  group=v["group"], rank=v["rank"], top_k=v["top_k"], dflash_extra=v.get("extra"))
    path, checkpoint, model = _convert(folder, target_path, tmp_path / "d.gguf", v["outtype"])
    assert model.config.is_causal is False and model.sliding_causal is False      # z-lab's DFlash2 config says so
    drafts = _engine_drafts(target_path, path, feats, model.config.block_size - 1)
    err_logits = err_scores = 0.0
    walk_differs_from_argmax = False
    ckpt_logits, ckpt_walks = [], []
    for end, anchor, d in zip(ROUNDS, ANCHORS, drafts):
        h = _block_hidden(model, emb, feats, anchor, end)
        with torch.no_grad():
            logits = model.logits(h, head)
            ref_ids, ref_scores = model.candidate_selector.lattice(h[1:], logits[1:], anchor)
            walk = model.propose(h, head, anchor)
            hc = _block_hidden(checkpoint, emb, feats, anchor, end)
            ckpt_logits.append(checkpoint.logits(hc, head).numpy())
            ckpt_walks.append(checkpoint.propose(hc, head, anchor))
        logits = logits.numpy()
        err_logits = max(err_logits, np.abs(logits - d.logits).max())
        cand, scores = d.lattice
        aligned = _aligned_scores(ref_ids.numpy(), ref_scores.numpy(), cand[1:], scores[1:])
        err_scores = max(err_scores, np.abs(aligned - scores[1:]).max())
        assert d.tokens == walk, (end, d.tokens, walk)
        walk_differs_from_argmax |= walk != logits[1:].argmax(1).tolist()
    diff, rows, toks = _agreement(ckpt_logits, [d.logits for d in drafts], ckpt_walks, [d.tokens for d in drafts])
    print(f"DFlash2 {variant}: max |Δ| block logits {err_logits:.2e}, lattice scores {err_scores:.2e}; against the "
          f"checkpoint: max |Δ| logits {diff:.2e}, same argmax {rows:.3f} of rows, same walk {toks:.3f} of tokens")
    assert err_logits <= TOL and err_scores <= TOL, (err_logits, err_scores)
    assert rows >= ROW_AGREEMENT and toks >= TOKEN_AGREEMENT, (rows, toks)
    assert walk_differs_from_argmax                     # the selector's pair scores change the draft
    # the convolutions matter: the same drafter with identity convolutions is far from what llama.cpp computed
    plain = copy.deepcopy(model)
    c = plain.config
    for layer in plain.layers:
        layer.attention_conv = GroupedDynamicCausalConv(c.hidden_size, c.conv_kernel_size, c.conv_group_size)
        layer.mlp_conv = GroupedDynamicCausalConv(c.hidden_size, c.conv_kernel_size, c.conv_group_size)
    with torch.no_grad():
        unconvolved = plain.logits(_block_hidden(plain, emb, feats, ANCHORS[0], ROUNDS[0]), head).numpy()
    assert np.abs(unconvolved - drafts[0].logits).max() > 0.1
    if model.config.layer_types:
        # sliding layers causal inside the block (DFlash's default, what patches/0005 did for every file before it
        # read attention.causal) is far from what llama.cpp computed
        plain.layers, plain.sliding_causal = model.layers, True
        with torch.no_grad():
            causal = plain.logits(_block_hidden(plain, emb, feats, ANCHORS[0], ROUNDS[0]), head).numpy()
        assert np.abs(causal - drafts[0].logits).max() > 0.1


@pytest.mark.parametrize("chain", ["numpy", "graph"])
@pytest.mark.parametrize("variant", list(DSPARK_VARIANTS))
def test_dspark_drafts_match_torch_reference(tmp_path, target, feats, variant, chain):
    """Both places the Markov chain runs: the engine's numpy chain (drafters on the CPU) and llama.cpp's graph
    (offloaded drafters; the confidence head is computed there only)."""
    v = DSPARK_VARIANTS[variant]
    in_graph = chain == "graph"
    read_confidence = v["confidence"] and in_graph
    target_path, emb, head = target
    tensors = dspark_tensors(TINY_DRAFTER, rank=v["rank"], confidence=v["confidence"], seed=3)
    folder = write_dspark_folder(tmp_path / "dspark_tiny_block8", TINY_DRAFTER, tensors, rank=v["rank"],
                                 confidence=v["confidence"], sample_from_anchor=v["anchor"])
    path, checkpoint, model = _convert(folder, target_path, tmp_path / "d.gguf", v["outtype"], markov_in_graph=in_graph)
    first = model.first_draft_row
    assert first == (0 if v["anchor"] in (True, None) else 1)
    drafts = _engine_drafts(target_path, path, feats, model.config.block_size - first, confidence=read_confidence,
                            markov_in_graph=in_graph)
    err_logits = err_conf = bias_of_chain = bias_of_anchor = 0.0
    ckpt_logits, ckpt_tokens = [], []
    for end, anchor, d in zip(ROUNDS, ANCHORS, drafts):
        with torch.no_grad():
            h = _block_hidden(model, emb, feats, anchor, end)
            chain = model.chain(h, head, anchor)
            raw = (h @ head.t()).numpy()
            anchor_bias = model.markov_head.bias(torch.tensor(anchor)).numpy()
            ckpt = checkpoint.chain(_block_hidden(checkpoint, emb, feats, anchor, end), head, anchor)
        ckpt_logits.append(ckpt.logits.numpy())
        ckpt_tokens.append(ckpt.tokens)
        assert d.tokens == chain.tokens, (end, d.tokens, chain.tokens)
        chained = chain.logits.numpy()
        ref = np.concatenate([raw[:first], chained])                    # bonus anchor: row 0 passes unbiased
        err_logits = max(err_logits, np.abs(ref - d.logits).max())
        if read_confidence:
            err_conf = max(err_conf, np.abs(chain.confidence.numpy() - d.confidence[first:]).max())
        bias_of_chain = max(bias_of_chain, np.abs(chained - raw[first:]).max())
        bias_of_anchor = max(bias_of_anchor, np.abs(chained - raw[first:] - anchor_bias).max())
    diff, rows, toks = _agreement(ckpt_logits, [d.logits[first:] for d in drafts], ckpt_tokens,
                                  [d.tokens for d in drafts])
    print(f"DSpark {variant}: max |Δ| logits {err_logits:.2e}, confidence {err_conf:.2e}; against the checkpoint: "
          f"max |Δ| logits {diff:.2e}, same argmax {rows:.3f} of rows, same tokens {toks:.3f}")
    assert err_logits <= TOL and err_conf <= TOL, (err_logits, err_conf)
    assert rows >= ROW_AGREEMENT and toks >= TOKEN_AGREEMENT, (rows, toks)
    assert bias_of_chain > 0.5 and bias_of_anchor > 0.5     # the head matters, and it follows the chain
