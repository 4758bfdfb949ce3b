"""--outtype: simple types through gguf.quants, K-quants through llama_model_quantize; norms stay F32;
every output loads and drafts in llama.cpp (write_dflash_gguf's load check) and shrinks as expected."""

import gguf
import numpy as np
import pytest

from helpers.convert import random_drafter, state_numpy
from dflash_gguf.convert.flavours import FLAVOURS
from dflash_gguf.convert.inspect_drafter import inspect_drafter
from dflash_gguf.convert.checkpoint_formats import read_source
from dflash_gguf.target_file import TargetFile
from dflash_gguf.convert.writer import OUTTYPES, write_dflash_gguf
from dflash_gguf.drafter.config import DrafterConfig
from helpers.engine import write_tiny_llama

pytest.importorskip("torch")
# hidden 256: K-quant super-blocks (256) fit the rows, so llama.cpp really uses the K types
CONFIG = DrafterConfig(hidden_size=256, intermediate_size=512, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=64,
                       target_layers=[1, 2], block_size=8, mask_token_id=5, vocab_size=64)
EXPECTED = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1",
            "q5_0": "Q5_0", "q5_1": "Q5_1", "q4_k": "Q4_K", "q5_k": "Q5_K", "q6_k": "Q6_K"}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("t") / "target.gguf", n_vocab=64, n_embd=256, n_layer=2,
                            n_head=4, n_ff=256)


@pytest.fixture(scope="module")
def tensors():
    return state_numpy(random_drafter(CONFIG))


@pytest.fixture(scope="module")
def f32_size(tmp_path_factory, target, tensors):
    return write_dflash_gguf(tensors, CONFIG, target, tmp_path_factory.mktemp("f") / "f32.gguf", outtype="f32") \
        .stat().st_size


def test_every_outtype_is_listed():
    assert set(EXPECTED) == set(OUTTYPES)


@pytest.mark.parametrize("outtype", [t for t in OUTTYPES if t != "f32"])
def test_outtype(tmp_path, target, tensors, f32_size, outtype):
    out = write_dflash_gguf(tensors, CONFIG, target, tmp_path / f"{outtype}.gguf", outtype=outtype)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(out)).tensors}
    assert types["blk.0.attn_norm.weight"] == "F32" and types["enc.output_norm.weight"] == "F32"
    # the bulk of the weights carries the requested type (llama.cpp's K-quant mixes may bump a few tensors)
    big = [types[n] for n in ("blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "blk.0.attn_q.weight")]
    assert EXPECTED[outtype] in big, (outtype, types)
    bits = 16 if outtype in ("f16", "bf16") else 8 if outtype == "q8_0" else 6.6
    assert out.stat().st_size < f32_size * (bits / 32) * 1.15
    report = inspect_drafter(out, target)
    assert report["fits_target"] and report["target_layers"] == [1, 2]
    assert not list(tmp_path.glob(".*"))          # no temporary files left


def test_quantized_weights_stay_close(tmp_path, target, tensors):
    """Q8_0 round trip through our writer and reader keeps every weight within Q8_0 precision."""
    out = write_dflash_gguf(tensors, CONFIG, target, tmp_path / "q8.gguf", outtype="q8_0")
    back = read_source(str(out), TargetFile.open(target)).tensors
    for name, ref in tensors.items():
        np.testing.assert_allclose(back[name], ref, atol=np.abs(ref).max() / 100 + 1e-6, err_msg=name)


def test_requantizing_a_foreign_flavour(tmp_path, target, tensors):
    """A Q8_0 dflash-draft (fork) file → upstream Q4_K: dequantized on read, requantized by llama.cpp."""
    from helpers.convert import write_flavoured_gguf
    q8 = write_dflash_gguf(tensors, CONFIG, target, tmp_path / "q8.gguf", outtype="q8_0")
    fork = write_flavoured_gguf(q8, tmp_path / "fork.gguf", next(f for f in FLAVOURS if f.name == "dflash-draft"))
    src = read_source(str(fork), TargetFile.open(target))
    out = write_dflash_gguf(src.tensors, src.config, target, tmp_path / "q4k.gguf", outtype="q4_k")
    assert inspect_drafter(out, target)["flavour"] == "upstream"
