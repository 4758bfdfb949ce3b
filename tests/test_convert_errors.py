"""convert: every bad input is refused with a clear error (which file, what is wrong, what to do) and no
output file is left behind."""

import json
import subprocess
import sys

import numpy as np
import pytest

from helpers.convert import random_drafter, state_numpy, write_zlab_folder
from dflash_gguf.convert.inspect_drafter import inspect_drafter
from dflash_gguf.convert.checkpoint_formats import read_source
from dflash_gguf.target_file import TargetFile
from dflash_gguf.convert.writer import ConvertError, finish, write_dflash_gguf
from dflash_gguf.drafter.config import DrafterConfig
from dflash_gguf.errors import UserError
from helpers.engine import write_tiny_llama

pytest.importorskip("torch")


def _nothing_written(folder) -> bool:
    return not [p for p in folder.iterdir() if p.name.startswith(("out", ".out"))]


def test_truncated_file(tmp_path, target, upstream):
    bad = tmp_path / "trunc.gguf"
    bad.write_bytes(upstream.read_bytes()[: upstream.stat().st_size // 2])
    with pytest.raises(UserError, match="trunc.gguf: tensor .* needs bytes up to .* the file is truncated"):
        read_source(str(bad), TargetFile.open(target))


def test_garbled_header(tmp_path, target, upstream):
    data = bytearray(upstream.read_bytes())
    data[8:40] = b"\xff" * 32
    bad = tmp_path / "garbled.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(UserError, match="garbled.gguf: .*damaged"):
        read_source(str(bad), TargetFile.open(target))


def test_truncated_safetensors(tmp_path, target, config):
    folder = write_zlab_folder(tmp_path / "zlab", config, state_numpy(random_drafter(config)))
    st = folder / "model.safetensors"
    st.write_bytes(st.read_bytes()[:-1000])
    with pytest.raises(UserError, match="runs past the end of the file; the file is truncated"):
        read_source(str(folder), TargetFile.open(target))


def test_wrong_architecture(target):
    with pytest.raises(UserError, match="architecture 'llama' is not a DFlash drafter.*--target"):
        read_source(str(target), TargetFile.open(target))


def test_drafter_passed_as_target(upstream):
    with pytest.raises(UserError, match="is a DFlash drafter, not a target model"):
        TargetFile.open(upstream)


def test_drafter_for_another_target(tmp_path, upstream):
    other = write_tiny_llama(tmp_path / "other.gguf", n_vocab=64, n_embd=96, n_layer=2, n_head=4)
    src = read_source(str(upstream), TargetFile.open(other))
    out = tmp_path / "out.gguf"
    with pytest.raises(ConvertError, match=r"does not fit target other.gguf: hidden size 64 != target hidden size "
                                           r"96.*out of range.*dflash-gguf train"):
        write_dflash_gguf(src.tensors, src.config, other, out, outtype="f32")
    assert _nothing_written(tmp_path)
    report = inspect_drafter(upstream, other)
    assert report["fits_target"] is False and "hidden size" in report["fit_problem"]


def test_mask_token_outside_the_target_vocabulary(tmp_path, target, config):
    small = write_tiny_llama(tmp_path / "small.gguf", n_vocab=4, n_embd=64, n_layer=3)
    with pytest.raises(ConvertError, match="mask token id 5 is outside the target vocabulary"):
        write_dflash_gguf(state_numpy(random_drafter(config)), config, small, tmp_path / "out.gguf")
    assert _nothing_written(tmp_path)


def test_shape_checks(tmp_path, target, config):
    tensors = state_numpy(random_drafter(config))
    bad = dict(tensors, **{"fc.weight": tensors["fc.weight"][:, :64]})
    with pytest.raises(ConvertError, match="fc.weight"):
        write_dflash_gguf(bad, config, target, tmp_path / "out.gguf", outtype="f32")
    wrong_heads = DrafterConfig(**{**config.__dict__, "head_dim": 8, "n_heads": 8, "n_kv_heads": 4})
    with pytest.raises(ConvertError, match="shapes do not match.*q_norm"):
        write_dflash_gguf(tensors, wrong_heads, target, tmp_path / "out.gguf", outtype="f32")
    extra = dict(tensors, **{"layers.0.self_attn.q_proj.bias": np.zeros(64, np.float32)})
    with pytest.raises(ConvertError, match="does not have.*q_proj.bias"):
        write_dflash_gguf(extra, config, target, tmp_path / "out.gguf", outtype="f32")
    nan = dict(tensors, **{"norm.weight": np.full(64, np.nan, np.float32)})
    with pytest.raises(ConvertError, match="NaN"):
        write_dflash_gguf(nan, config, target, tmp_path / "out.gguf", outtype="f32")
    assert _nothing_written(tmp_path)


@pytest.mark.parametrize("edit,message", [
    (lambda c: c["dflash_config"].pop("mask_token_id"), "mask_token_id is missing"),
    (lambda c: c["dflash_config"].update(selector_rank=8), "a DFlash2 config, but .* no attention_conv"),
    (lambda c: c.update(attention_bias=True), "attention biases"),
    (lambda c: c.update(hidden_act="gelu"), "silu"),
    (lambda c: c.update(rope_scaling={"rope_type": "longrope", "factor": 2.0}), "rope scaling 'longrope'"),
    (lambda c: c.update(partial_rotary_factor=0.5), "partial rotary"),
    (lambda c: c.pop("num_attention_heads"), "incomplete or inconsistent drafter config"),
    (lambda c: c.update(architectures=["Qwen3DSparkModel"]), "a DSpark config, but .* no markov_head"),
    (lambda c: c["dflash_config"].update(attention_value_scale=0.5), "attention \\(value\\) scales"),
], ids=["no-mask", "dflash2", "bias", "gelu", "longrope", "partial-rope", "incomplete", "dspark", "value-scale"])
def test_zlab_configs_we_cannot_represent(tmp_path, target, config, edit, message):
    folder = write_zlab_folder(tmp_path / "zlab", config, state_numpy(random_drafter(config)))
    cfg = json.loads((folder / "config.json").read_text())
    edit(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match=message):
        read_source(str(folder), TargetFile.open(target))


def test_warns_when_the_drafter_names_another_target(tmp_path, target, config):
    folder = write_zlab_folder(tmp_path / "Qwen3-8B-DFlash-b16", config, state_numpy(random_drafter(config)),
                               n_target_layers=36)
    out = tmp_path / "out.gguf"
    r = subprocess.run([sys.executable, "-m", "dflash_gguf.cli", "convert", str(folder), "--target", str(target),
                        "-o", str(out), "--outtype", "f32"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr           # shapes fit: a warning, not an error
    assert "warning: the drafter names 'Qwen3-8B' as its target" in r.stderr
    assert "built for a 36-layer target, this one has 3" in r.stderr


def test_missing_source_and_bad_outtype(tmp_path, target, config):
    with pytest.raises(UserError, match="no such file or folder"):
        read_source(str(tmp_path / "nope"), TargetFile.open(target))
    with pytest.raises(ConvertError, match="--outtype q3_x: choose one of"):
        write_dflash_gguf(state_numpy(random_drafter(config)), config, target, tmp_path / "out.gguf", outtype="q3_x")


def test_fork_file_with_two_tensors_for_one_weight(tmp_path, target, upstream):
    """A dflash-draft file carrying both post_attention_norm and ffn_norm (a sandwich-norm variant) is
    refused instead of silently keeping one of them."""
    import gguf

    from helpers.convert import write_flavoured_gguf
    from dflash_gguf.convert.flavours import FLAVOURS
    dd = next(f for f in FLAVOURS if f.name == "dflash-draft")
    src = write_flavoured_gguf(upstream, tmp_path / "dd.gguf", dd)
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(tmp_path / "both.gguf"), "dflash-draft")
    for key, f in r.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            w.add_key_value(key, f.contents(), f.types[0], sub_type=f.types[1] if len(f.types) > 1 else None)
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(64, np.float32))
    finish(w)
    with pytest.raises(UserError, match="both read as 'layers.0.post_attention_layernorm.weight'"):
        read_source(str(tmp_path / "both.gguf"), TargetFile.open(target))
