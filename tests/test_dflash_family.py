"""DFlash2 and DSpark drafters: HF checkpoints and GGUFs of every flavour convert into one validated `dflash`
GGUF that the pinned llama.cpp loads and drafts with; the validator knows their keys and shapes; inspect
names the member."""

from __future__ import annotations

import shutil

import gguf
import numpy as np
import pytest

from helpers.convert import write_flavoured_gguf
from dflash_gguf import gguf_check
from dflash_gguf.convert.flavours import FLAVOURS, detect_flavour, normalize_gguf
from dflash_gguf.convert.inspect_drafter import inspect_drafter
from dflash_gguf.convert.checkpoint_formats import read_source
from dflash_gguf.target_file import TargetFile
from dflash_gguf.convert.writer import write_dflash_gguf
from dflash_gguf.errors import UserError
from helpers.engine import TINY_DRAFTER, write_tiny_llama
from helpers.family import dflash2_tensors, dspark_tensors, write_dflash2_folder, write_dspark_folder

pytest.importorskip("torch")
CONFIG = TINY_DRAFTER


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("family")
    target = write_tiny_llama(d / "target.gguf", n_vocab=64, n_embd=64, n_layer=3)
    out = {"dir": d, "target": target,
           "dflash2_hf": write_dflash2_folder(d / "Tiny-DFlash2", CONFIG, dflash2_tensors(CONFIG)),
           "dspark_hf": write_dspark_folder(d / "dspark_tiny_block8", CONFIG, dspark_tensors(CONFIG))}
    tinfo = TargetFile.open(target)
    for kind in ("dflash2", "dspark"):
        src = read_source(str(out[f"{kind}_hf"]), tinfo)
        out[f"{kind}_src"] = src
        out[f"{kind}_gguf"] = write_dflash_gguf(src.tensors, src.config, target, d / f"{kind}.gguf", outtype="f32")
    return out


@pytest.mark.parametrize("kind,member", [("dflash2", "DFlash2"), ("dspark", "DSpark")])
def test_hf_checkpoint_converts_validates_and_loads(files, kind, member):
    """write_dflash_gguf load-checks through llama.cpp (one injection + one draft with finite logits)."""
    src = files[f"{kind}_src"]
    assert src.config.family == member
    h = gguf_check.check_drafter(files[f"{kind}_gguf"], files["target"])
    assert gguf_check.drafter_member(h).name == member
    report = inspect_drafter(files[f"{kind}_gguf"], files["target"])
    assert report["family"] == member and report["fits_target"]


def test_dflash2_settings_and_layout(files):
    c = files["dflash2_src"].config
    assert (c.conv_kernel_size, c.conv_group_size, c.selector_rank, c.selector_top_k) == (2, 16, 8, 4)
    r = gguf.GGUFReader(str(files["dflash2_gguf"]))
    shapes = {t.name: (tuple(int(x) for x in t.shape), t.tensor_type.name) for t in r.tensors}
    assert shapes["blk.1.attn_conv_base"] == ((64, 2, 2), "F32")
    assert shapes["blk.0.ffn_conv_proj.weight"][0] == (64, 16)
    assert shapes["selector_predecessor.weight"][0] == (8, 64) and shapes["selector_hidden.weight"][0] == (64, 8)
    assert int(r.fields["dflash.selector_top_k"].contents()) == 4
    # z-lab's is_causal: false (every layer non-causal) is kept as upstream's converter keeps it (patches/0005 reads it)
    assert c.is_causal is False and r.fields["dflash.attention.causal"].contents() is False
    # the conv base kernel round-trips exactly ([2, k, H] torch ↔ ne {H, k, 2})
    got = np.asarray(next(t for t in r.tensors if t.name == "blk.0.attn_conv_base").data).reshape(2, 2, 64)
    np.testing.assert_array_equal(got, files["dflash2_src"].tensors["layers.0.attention_conv.base_kernel"])


def test_dspark_settings_and_layout(files):
    src = files["dspark_src"]
    c = src.config
    assert (c.markov_rank, c.confidence_head, c.sample_from_anchor) == (8, True, True)
    assert not any(k.startswith(("embed_tokens", "lm_head")) for k in src.tensors)
    r = gguf.GGUFReader(str(files["dspark_gguf"]))
    names = {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}
    assert names["markov_w1.weight"] == (8, 64) and names["conf_proj.weight"][0] == 72
    assert r.fields["dflash.sample_from_anchor"].contents() is True


@pytest.mark.parametrize("kind", ["dflash2", "dspark"])
def test_gguf_round_trip_and_quantized(files, kind, tmp_path):
    """Our own GGUF converts again (q8_0 this time, load-checked) into the same member and settings."""
    src = normalize_gguf(files[f"{kind}_gguf"], detect_flavour(files[f"{kind}_gguf"]), TargetFile.open(files["target"]))
    assert src.config.family == files[f"{kind}_src"].config.family
    for k in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k", "markov_rank",
              "confidence_head", "sample_from_anchor", "is_causal"):
        assert getattr(src.config, k) == getattr(files[f"{kind}_src"].config, k), k
    out = write_dflash_gguf(src.tensors, src.config, files["target"], tmp_path / "q8.gguf", outtype="q8_0")
    assert gguf_check.drafter_member(gguf_check.check_drafter(out, files["target"])) is src.config.member


def test_old_dspark_arch_is_migrated(files, tmp_path):
    """A GGUF of the older `dspark` architecture: the validator says convert it; convert makes it `dflash`."""
    flavour = next(f for f in FLAVOURS if f.name == "dspark")
    old = write_flavoured_gguf(files["dspark_gguf"], tmp_path / "old.gguf", flavour)
    with pytest.raises(gguf_check.BadModelFile, match="convert it first"):
        gguf_check.check_drafter(old)
    src = read_source(str(old), TargetFile.open(files["target"]))
    assert src.config.family == "DSpark" and src.config.target_layers == CONFIG.target_layers
    out = write_dflash_gguf(src.tensors, src.config, files["target"], tmp_path / "new.gguf", outtype="f16")
    assert inspect_drafter(out)["family"] == "DSpark"


def _rewrite(src, dst, drop_keys=(), reshape=None):
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), "dflash")
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop_keys:
            continue
        w.add_key_value(key, f.contents(), f.types[0], sub_type=f.types[1] if len(f.types) > 1 else None)
    for t in r.tensors:
        data = np.array(t.data)
        if reshape and t.name in reshape:
            data = reshape[t.name](data)
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_validator_rejects_incomplete_dflash2(files, tmp_path):
    bad = _rewrite(files["dflash2_gguf"], tmp_path / "nokey.gguf", drop_keys=("dflash.selector_top_k",))
    with pytest.raises(gguf_check.BadModelFile, match="dflash.selector_top_k"):
        gguf_check.check_drafter(bad)
    short = _rewrite(files["dflash2_gguf"], tmp_path / "shape.gguf",
                     reshape={"selector_hidden.weight": lambda a: a[:4].copy()})
    with pytest.raises(gguf_check.BadModelFile, match="selector_hidden.weight"):
        gguf_check.check_drafter(short)


def test_validator_rejects_bad_dspark(files, tmp_path):
    bad = _rewrite(files["dspark_gguf"], tmp_path / "w2.gguf",
                   reshape={"markov_w2.weight": lambda a: a[:, :4].copy()})
    with pytest.raises(gguf_check.BadModelFile, match="markov_w2.weight"):
        gguf_check.check_drafter(bad)


def test_refused_dspark_variants(files, tmp_path):
    import json
    folder = tmp_path / "gated"
    shutil.copytree(files["dspark_hf"], folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg | {"markov_head_type": "gated"}))
    with pytest.raises(UserError, match="gated/rnn Markov head"):
        read_source(str(folder), TargetFile.open(files["target"]))
