"""convert: every source schema becomes the same validated upstream `dflash` GGUF."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.convert import random_drafter, state_numpy, write_flavoured_gguf, write_zlab_folder
from dflash_gguf.convert.flavours import FLAVOURS, UNSUPPORTED
from dflash_gguf.convert.inspect_drafter import inspect_drafter
from dflash_gguf.drafter.tensor_names import GLOBAL_NAMES, LAYER_NAMES
from dflash_gguf.convert.checkpoint_formats import read_source
from dflash_gguf.target_file import TargetFile
from dflash_gguf.convert.writer import write_dflash_gguf
from dflash_gguf.drafter.config import DrafterConfig, official_target_layer_ids

pytest.importorskip("torch")


def _tensors(path: Path, target: Path) -> dict:
    return read_source(str(path), TargetFile.open(target)).tensors


def test_zlab_folder_bf16_with_formula_layer_ids(tmp_path, target, config):
    model = random_drafter(config, seed=2)
    folder = write_zlab_folder(tmp_path / "zlab", config, state_numpy(model), with_ids=False, n_target_layers=3)
    src = read_source(str(folder), TargetFile.open(target))
    assert src.config.target_layers == [2, 1]          # official formula for N=3, L=2 is [1, 0]; tap ids are +1
    assert any("official formula" in n for n in src.notes)
    for k, v in state_numpy(model).items():            # bf16 → f32 within bf16 precision
        np.testing.assert_allclose(src.tensors[k], v, rtol=1e-2, atol=1e-2)


def test_sharded_zlab_folder_reads_every_shard(tmp_path, target, config):
    tensors = state_numpy(random_drafter(config))
    folder = write_zlab_folder(tmp_path / "zlab", config, tensors, bf16=False, shards=3)
    src = read_source(str(folder), TargetFile.open(target))
    assert set(src.tensors) == set(tensors)
    for k, v in tensors.items():
        np.testing.assert_array_equal(src.tensors[k], v)


def test_hf_repo_id_from_the_local_cache_offline(tmp_path, target, config, monkeypatch):
    """A repo id resolves through huggingface_hub's cache layout without network access."""
    cache = tmp_path / "hub"
    snap = cache / "models--someone--Tiny-DFlash" / "snapshots" / ("a" * 40)
    write_zlab_folder(snap, config, state_numpy(random_drafter(config)), bf16=False)
    (cache / "models--someone--Tiny-DFlash" / "refs").mkdir()
    (cache / "models--someone--Tiny-DFlash" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hc
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    src = read_source("someone/Tiny-DFlash", TargetFile.open(target))
    assert src.config.target_layers == [1, 3] and src.trained_for == "Tiny"


def test_cli_convert_zlab_folder_writes_upstream_schema(tmp_path, target, config):
    folder = write_zlab_folder(tmp_path / "zlab", config, state_numpy(random_drafter(config)))
    out = tmp_path / "draft.gguf"
    cmd = [sys.executable, "-m", "dflash_gguf.cli", "convert", str(folder), "--target", str(target), "-o", str(out)]
    r = subprocess.run(cmd + ["--outtype", "q8_0"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "MiB as F32 ->" in r.stderr                        # sizes before/after
    report = inspect_drafter(out, target)
    assert report["flavour"] == "upstream" and report["fits_target"] and report["warnings"] == []
    assert report["target_layers"] == [1, 3] and report["block_size"] == 8 and report["mask_token_id"] == 5
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 2 and "--force" in r.stderr
    r = subprocess.run(cmd + ["--force", "--outtype", "f32"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("flavour", [f for f in FLAVOURS if f.name != "upstream"], ids=lambda f: f.name)
def test_every_flavour_normalises_to_upstream(tmp_path, target, upstream, flavour):
    foreign = write_flavoured_gguf(upstream, tmp_path / f"{flavour.name}.gguf", flavour)
    src = read_source(str(foreign), TargetFile.open(target))
    assert src.config.target_layers == [1, 3], flavour.name          # ids normalised to tap ids
    ref = _tensors(upstream, target)
    assert set(src.tensors) == set(ref)
    for k in ref:
        np.testing.assert_array_equal(src.tensors[k], ref[k])
    out = write_dflash_gguf(src.tensors, src.config, target, tmp_path / "norm.gguf", outtype="f32")
    assert inspect_drafter(out, target)["flavour"] == "upstream"


def test_fork_drafter_with_embedded_head_and_no_layer_ids(tmp_path, target, upstream):
    """buun/ik files may embed token_embd/output (dropped: borrowed from the target); Lucebox files may omit
    the layer ids (the official formula for the target's depth fills them in, with a note)."""
    dd = next(f for f in FLAVOURS if f.name == "dflash-draft")
    src = read_source(str(write_flavoured_gguf(upstream, tmp_path / "dd.gguf", dd, embed_borrowed=True)),
                      TargetFile.open(target))
    assert "token_embd.weight" not in src.tensors and any("dropped token_embd" in n for n in src.notes)
    luce = next(f for f in FLAVOURS if f.name == "qwen35-dflash-draft")
    src = read_source(str(write_flavoured_gguf(upstream, tmp_path / "lb.gguf", luce, with_ids=False)),
                      TargetFile.open(target))
    assert src.config.target_layers == [i + 1 for i in official_target_layer_ids(3, 2)]
    assert any("official formula" in n for n in src.notes)


@pytest.mark.parametrize("marker,what", UNSUPPORTED, ids=[m for m, _ in UNSUPPORTED])
def test_other_drafter_designs_are_refused(tmp_path, target, upstream, marker, what):
    from dflash_gguf.errors import UserError
    # upstream's own schema loads a d2t vocabulary (tests/test_draft_vocab.py); the forks' d2t designs differ
    up = next(f for f in FLAVOURS if f.name == ("dflash-draft" if marker == "d2t" else "upstream"))
    bad = write_flavoured_gguf(upstream, tmp_path / "x.gguf", up, extra_keys={marker: 1})
    with pytest.raises(UserError, match="only DFlash, DFlash2 and DSpark drafters"):
        read_source(str(bad), TargetFile.open(target))


def test_flavour_tables_are_unambiguous():
    names = [f.name for f in FLAVOURS]
    assert len(names) == len(set(names))
    by_arch = {}
    for f in FLAVOURS:
        by_arch.setdefault(f.arch, []).append(f)
        # every alias lands on an upstream name, and no two flavour names land on the same one
        assert set(f.global_aliases.values()) <= set(GLOBAL_NAMES.values()), f.name
        assert set(f.layer_aliases.values()) <= set(LAYER_NAMES.values()), f.name
        assert len(set(f.global_aliases.values())) == len(f.global_aliases), f.name
        assert not set(f.global_aliases) & set(GLOBAL_NAMES.values()), f.name
    for arch, rows in by_arch.items():     # same arch: all but the catch-all carry a distinct marker, catch-all last
        markers = [f.marker for f in rows]
        assert markers.count(None) <= 1 and len(set(markers)) == len(markers), arch
        assert None not in markers[:-1], arch
    assert len(set(GLOBAL_NAMES.values())) == len(GLOBAL_NAMES) and len(set(LAYER_NAMES.values())) == len(LAYER_NAMES)
    assert len({m for m, _ in UNSUPPORTED}) == len(UNSUPPORTED)


def test_official_layer_formula():
    f = official_target_layer_ids
    assert f(36, 5) == [1, 9, 17, 25, 33] and f(64, 5) == [1, 16, 31, 46, 61] and f(40, 5) == [1, 10, 19, 28, 37]
    assert f(32, 5) == [1, 8, 15, 22, 29] and f(32, 1) == [16]


def test_sliding_window_yarn_and_scales_survive_the_round_trip(tmp_path, target):
    """z-lab folder with SWA layers + YaRN + embedding scale → our GGUF → read back identically, and llama.cpp
    loads it (write_dflash_gguf's load check)."""
    config = DrafterConfig(hidden_size=64, intermediate_size=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                           target_layers=[1, 3], block_size=8, mask_token_id=5, vocab_size=64, rope_theta=10000.0,
                           sliding_window=6, layer_types=["sliding_attention", "full_attention"],
                           rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                         "attention_factor": 1.2})
    folder = write_zlab_folder(tmp_path / "zlab", config, state_numpy(random_drafter(config)))
    cfg = json.loads((folder / "config.json").read_text())
    cfg["dflash_config"]["input_embedding_scale"] = 8.0
    (folder / "config.json").write_text(json.dumps(cfg))
    src = read_source(str(folder), TargetFile.open(target))
    out = write_dflash_gguf(src.tensors, src.config, target, tmp_path / "d.gguf", outtype="f16")
    back = read_source(str(out), TargetFile.open(target)).config
    assert back.layer_types == config.layer_types and back.sliding_window == 6
    assert back.rope_scaling["rope_type"] == "yarn" and back.rope_scaling["original_max_position_embeddings"] == 64
    assert back.rope_scaling["factor"] == 4.0 and abs(back.rope_scaling["attention_factor"] - 1.2) < 1e-6
    assert back.embedding_scale == 8.0


def test_torch_reference_has_the_zlab_schema_and_config_round_trips(config):
    """state_dict() names/shapes are exactly a z-lab checkpoint's (what the writer expects), no extra buffers."""
    from dflash_gguf.convert.checks import expected_shapes
    from dflash_gguf.drafter.torch_ref import DFlashDrafter
    swa = DrafterConfig(**{**config.__dict__, "sliding_window": 4, "layer_types": ["sliding_attention"] * 2,
                           "rope_scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32}})
    for c in (config, swa):
        sd = DFlashDrafter(c).state_dict()
        assert {k: tuple(v.shape) for k, v in sd.items()} == expected_shapes(c)
        assert DrafterConfig.from_json(c.to_json()) == c
