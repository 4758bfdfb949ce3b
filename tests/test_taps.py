"""Layer taps through the dflash C API equal independent readings of the same hidden states.

Tap id 0 = token embeddings, id i = output of transformer layer i-1 (HF hidden_states[i]), id n_layer =
output of the last layer before the final norm (only output rows filled).
- tiny random Qwen3 (F32, converted with the vendored convert_hf_to_gguf.py) vs transformers;
- SmolLM2 Q4_1 (llama) and Gemma 3 270M (gemma3, patch 0002) vs cb_eval copies of `l_out-*`, taken in
  a second context without taps and the same batch shape, so the kernels match;
- a prefill split over several ubatches comes back in batch order; error paths raise TapError.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import shutil

import numpy as np
import pytest

from dflash_gguf.native.wrappers import Batch, Context, ContextSettings, Model, TapError

N_THREADS = 2
TINY_QWEN3 = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, vocab_size=49152, max_position_embeddings=2048,
                  tie_word_embeddings=False)


# --- tiny random Qwen3: HF folder + F32 GGUF, cached -------------------------------------------------

def tiny_qwen3(seed: int = 0):
    """(hf_dir, gguf_path) of a seeded random Qwen3 with SmolLM2's vocabulary, cached by its spec."""
    from dflash_gguf.paths import cache_root
    spec = json.dumps({"config": TINY_QWEN3, "seed": seed, "outtype": "f32"}, sort_keys=True)
    root = cache_root() / "fixtures" / f"tiny-qwen3-{hashlib.sha256(spec.encode()).hexdigest()[:12]}"
    if not (root / "model.gguf").is_file():
        _build_tiny_qwen3(root, seed)
    return root / "hf", root / "model.gguf"


def _build_tiny_qwen3(root, seed: int) -> None:
    import torch
    import transformers
    from transformers import AutoTokenizer

    from helpers.engine import convert_hf, smollm2_tokenizer_dir
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    torch.manual_seed(seed)
    transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**TINY_QWEN3)).save_pretrained(tmp / "hf")
    # the converter only accepts tokenizers whose pre-tokenizer hash it knows: reuse SmolLM2's
    AutoTokenizer.from_pretrained(smollm2_tokenizer_dir()).save_pretrained(tmp / "hf")
    convert_hf(tmp / "hf", tmp / "model.gguf", "f32")
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)


@pytest.fixture(scope="module")
def qwen3():
    """The tiny Qwen3 GGUF, a 40-token prompt and transformers' hidden states for it."""
    import torch
    import transformers

    hf_dir, gguf_path = tiny_qwen3()
    tokens = np.random.default_rng(1).integers(3, TINY_QWEN3["vocab_size"], 40).tolist()
    hf = transformers.Qwen3ForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
    hf.eval()
    last = {}
    hook = hf.model.layers[-1].register_forward_hook(
        lambda mod, args, out: last.__setitem__("out", out[0] if isinstance(out, tuple) else out))
    with torch.no_grad():
        out = hf(torch.tensor([tokens]), output_hidden_states=True)
    hook.remove()
    n_layer = TINY_QWEN3["num_hidden_layers"]
    # hidden[i] = tap id i: HF's hidden_states[n_layer] is after the final norm, taps are before it
    hidden = [h[0].numpy() for h in out.hidden_states[:n_layer]] + [last["out"][0].numpy()]
    model = Model(gguf_path)
    yield model, tokens, hidden
    model.close()


def _tapped_prefill(model: Model, tokens: list[int], taps: list[int], n_ubatch: int, logits="all") -> np.ndarray:
    """Features of one prefill: [n_tokens, n_taps, n_embd]."""
    ctx = Context(model, ContextSettings(n_ctx=256, n_batch=64, n_ubatch=n_ubatch, n_threads=N_THREADS,
                                         flash_attn="off"))
    ctx.set_taps(taps)
    batch = Batch(model.native, 64)
    batch.set_tokens(tokens, 0, logits)
    ctx.decode(batch)
    feats = ctx.get_taps(0, len(tokens)).reshape(len(tokens), len(taps), model.n_embd)
    batch.close()
    ctx.close()
    return feats


def test_qwen3_taps_equal_transformers_hidden_states(qwen3):
    model, tokens, hidden = qwen3
    n_layer = model.n_layer
    taps = [0, 1, n_layer // 2, n_layer]
    feats = _tapped_prefill(model, tokens, taps, n_ubatch=64)
    for k, tap in enumerate(taps):
        diff = np.abs(feats[:, k] - hidden[tap]).max()
        assert diff <= 1e-3, f"tap {tap}: max |diff| {diff} vs transformers"
        # the comparison can tell neighbouring layers apart
        for other in (tap - 1, tap + 1):
            if 0 <= other <= n_layer:
                assert np.abs(feats[:, k] - hidden[other]).max() > 0.05, (tap, other)


def test_last_layer_tap_fills_only_output_rows(qwen3):
    model, tokens, hidden = qwen3
    n = len(tokens)
    mask = [i % 3 == 0 for i in range(n)]
    feats = _tapped_prefill(model, tokens, [1, model.n_layer], n_ubatch=64, logits=mask)
    rows = np.flatnonzero(mask)
    assert np.abs(feats[:, 0] - hidden[1]).max() <= 1e-3          # inner layers: every row
    assert np.abs(feats[rows, 1] - hidden[model.n_layer][rows]).max() <= 1e-3
    assert not feats[~np.asarray(mask), 1].any()


def test_prefill_split_over_ubatches_keeps_batch_order(qwen3):
    model, tokens, hidden = qwen3
    taps = [1, 2, model.n_layer]
    whole = _tapped_prefill(model, tokens, taps, n_ubatch=64)
    split = _tapped_prefill(model, tokens, taps, n_ubatch=8)          # 40 rows -> 5 ubatches
    assert np.abs(split - whole).max() <= 1e-4
    assert np.abs(split[:, 0] - hidden[1]).max() <= 1e-3
    # rows are distinct enough that any reordering would show
    assert np.abs(split[1:, 0] - whole[:-1, 0]).max() > 0.05

    ctx = Context(model, ContextSettings(n_ctx=256, n_batch=64, n_ubatch=8, n_threads=N_THREADS, flash_attn="off"))
    ctx.set_taps(taps)
    batch = Batch(model.native, 64)
    batch.set_tokens(tokens, 0, "all")
    ctx.decode(batch)
    sub = ctx.get_taps(13, 9).reshape(9, len(taps), model.n_embd)     # straddles ubatches 1..2
    np.testing.assert_array_equal(sub, ctx.get_taps(0, len(tokens)).reshape(-1, len(taps), model.n_embd)[13:22])
    assert np.abs(sub - whole[13:22]).max() <= 1e-4


# --- real models vs cb_eval ----------------------------------------------------------------------------

class _GgmlTensor(ctypes.Structure):
    """Mirror of `struct ggml_tensor` at the pinned commit (sizeof 336), enough to read name and shape."""
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]


def _read_graph_nodes(model: Model, tokens: list[int], names: set[str]) -> dict[str, np.ndarray]:
    """The named graph nodes of one single-ubatch, all-logits decode, copied out by cb_eval in a plain
    context (no taps). Values: [n_rows, n_embd] float32."""
    native = model.native
    L = native.llama_cpp
    get = native.ggml_base.ggml_backend_tensor_get
    get.argtypes, get.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t], None
    assert ctypes.sizeof(_GgmlTensor) == 336
    seen: dict[str, np.ndarray] = {}

    @L.ggml_backend_sched_eval_callback
    def observe(t_ptr, ask, _user):
        t = ctypes.cast(t_ptr, ctypes.POINTER(_GgmlTensor)).contents
        name = t.name.decode()
        if ask:
            return name in names
        assert t.type == 0 and t.ne[2] == 1, (name, t.type, list(t.ne))     # F32, 2-D
        arr = np.empty((t.ne[1], t.ne[0]), np.float32)
        get(t_ptr, arr.ctypes.data, 0, arr.nbytes)
        seen[name] = arr
        return True

    p = L.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch = 256, 64, 64
    p.n_threads = p.n_threads_batch = N_THREADS
    p.flash_attn_type = 0
    p.cb_eval = observe
    ctx = L.llama_init_from_model(model.ptr, p)
    assert ctx
    batch = Batch(native, 64)
    batch.set_tokens(tokens, 0, "all")
    try:
        assert L.llama_decode(ctx, batch.raw) == 0
    finally:
        batch.close()
        L.llama_free(ctx)
    return seen


@pytest.mark.slow
# embd_node: the embeddings as the first layer sees them (Gemma scales them by sqrt(n_embd))
@pytest.mark.parametrize("which, embd_node", [("smollm2", "embd"), ("gemma3", "inp_scaled")])
def test_real_model_taps_equal_cb_eval_layer_outputs(which, embd_node):
    from dflash_gguf import packaged_models
    path = packaged_models.smollm2_q4_1() if which == "smollm2" else packaged_models.gemma3_270m()
    model = Model(path)
    n_layer = model.n_layer
    taps = [0, 1, n_layer // 2, n_layer]
    tokens = model.tokenize("The quick brown fox jumps over the lazy dog, and then", add_special=True)[:16]
    feats = _tapped_prefill(model, tokens, taps, n_ubatch=64).transpose(1, 0, 2)   # [n_taps, n_tokens, n_embd]
    nodes = _read_graph_nodes(model, tokens, {embd_node} | {f"l_out-{t - 1}" for t in taps[1:]})
    expected = [nodes[embd_node]] + [nodes[f"l_out-{t - 1}"] for t in taps[1:]]
    for tap, got, want in zip(taps, feats, expected):
        assert want.shape == got.shape, (tap, want.shape)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max(), err_msg=f"{which} tap {tap}")
    model.close()


# --- error paths -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from helpers.engine import write_tiny_llama
    model = Model(write_tiny_llama(tmp_path_factory.mktemp("llama") / "tiny.gguf", n_layer=2))
    yield model
    model.close()


def test_bad_tap_ids_raise(tiny_llama):
    ctx = Context(tiny_llama, ContextSettings(n_ctx=64, n_batch=16, n_ubatch=16, n_threads=N_THREADS))
    for ids in ([tiny_llama.n_layer + 1], [-1], [1, 1]):
        with pytest.raises(TapError, match="cannot tap"):
            ctx.set_taps(ids)
    ctx.set_taps([0, tiny_llama.n_layer])


def test_bad_row_ranges_raise(tiny_llama):
    ctx = Context(tiny_llama, ContextSettings(n_ctx=64, n_batch=16, n_ubatch=16, n_threads=N_THREADS))
    ctx.set_taps([1])
    with pytest.raises(TapError, match="failed"):
        ctx.get_taps(0, 1)                                   # nothing decoded yet
    batch = Batch(tiny_llama.native, 16)
    batch.set_tokens([5, 6, 7, 8, 9, 10, 11, 12], 0, "all")
    ctx.decode(batch)
    for i0, n in ((5, 4), (-1, 2), (0, 0), (8, 1)):
        with pytest.raises(TapError, match="failed"):
            ctx.get_taps(i0, n)
    assert ctx.get_taps(4, 4).shape == (4, tiny_llama.n_embd)
    ctx.set_taps([2])                                        # enabled after the decode: nothing captured
    with pytest.raises(TapError):
        ctx.get_taps(0, 8)
    ctx.set_taps([])
    with pytest.raises(TapError):
        ctx.get_taps(0, 8)


def test_architecture_without_taps_raises_instead_of_aborting(tmp_path):
    from helpers.engine import write_tiny_llama
    model = Model(write_tiny_llama(tmp_path / "xverse.gguf", arch="xverse", n_layer=2))
    assert model.arch == "xverse"
    ctx = Context(model, ContextSettings(n_ctx=64, n_batch=16, n_ubatch=16, n_threads=N_THREADS))
    ctx.set_taps([0, 1])
    batch = Batch(model.native, 16)
    batch.set_tokens([5, 6, 7, 8], 0, "all")
    ctx.decode(batch)                                        # the decode itself still works
    assert np.isfinite(ctx.logits(3)).all()
    with pytest.raises(TapError, match="does not record layer inputs"):
        ctx.get_taps(0, 4)
