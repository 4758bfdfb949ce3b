"""Model discovery: LM Studio's tree, Jan's data folder and the HF cache (a fake HOME), with the drafters
that fit each by GGUF metadata (hidden size, layer count, vocabulary), and the names `serve -m` takes."""

import json
import shutil

import pytest

from dflash_gguf.errors import UserError
from dflash_gguf.server.discovery import drafters_for, resolve_model, scan
from helpers.engine import write_random_drafter, write_tiny_llama


@pytest.fixture
def fake_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for var in ("HF_HOME", "HF_HUB_CACHE", "JAN_DATA_FOLDER", "JAN_DATA_ROOT", "XDG_DATA_HOME", "XDG_CONFIG_HOME",
                "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr("sys.platform", "linux")
    src = tmp_path / "src"
    src.mkdir()
    target = write_tiny_llama(src / "tiny.gguf", n_layer=3)
    drafter = write_random_drafter(target, src / "tiny-dflash.gguf", taps=[1, 2], n_head=4, n_head_kv=2,
                                   head_dim=16, n_ff=64)
    # LM Studio: publisher/model/file; the drafter sits beside its target; a projector is not a model
    lms = home / ".lmstudio" / "models" / "acme" / "Tiny-GGUF"
    lms.mkdir(parents=True)
    shutil.copy(target, lms / "tiny-f32.gguf")
    shutil.copy(drafter, lms / "tiny-dflash.gguf")
    (lms / "mmproj-tiny-f16.gguf").write_bytes(b"not a model")
    # Jan: the default data folder, and a second one named in Jan's settings.json
    jan = home / ".local" / "share" / "Jan" / "data" / "llamacpp" / "models" / "tiny"
    jan.mkdir(parents=True)
    shutil.copy(target, jan / "model.gguf")
    (jan / "model.yml").write_text("model_path: llamacpp/models/tiny/model.gguf\nname: tiny\n")
    moved = tmp_path / "jan-moved"
    (moved / "llamacpp" / "models" / "org" / "wide").mkdir(parents=True)
    write_tiny_llama(moved / "wide.gguf", n_layer=3, n_embd=96, n_head=4)
    (moved / "llamacpp" / "models" / "org" / "wide" / "model.yml").write_text(f"model_path: {moved / 'wide.gguf'}\n")
    (home / ".local" / "share" / "jan.ai.app").mkdir(parents=True)
    (home / ".local" / "share" / "jan.ai.app" / "settings.json").write_text(json.dumps({"data_folder": str(moved)}))
    # Hugging Face cache: a nested file; a different vocabulary, so the drafter does not fit
    hf = home / ".cache" / "huggingface" / "hub" / "models--acme--Tiny-GGUF" / "snapshots" / "abc123" / "q"
    hf.mkdir(parents=True)
    write_tiny_llama(hf / "other.gguf", n_layer=3, n_vocab=48)
    return home


def test_scan_lists_targets_with_fitting_drafters(fake_home):
    found = {f.name: f for f in scan() if f.source != "shipped"}
    assert set(found) == {"lmstudio:acme/Tiny-GGUF", "lmstudio:acme/Tiny-GGUF/tiny-dflash.gguf", "jan:tiny",
                          "jan:org/wide", "hf:acme/Tiny-GGUF/q/other.gguf"}
    lms = found["lmstudio:acme/Tiny-GGUF"]
    assert not lms.is_drafter and (lms.n_embd, lms.n_layer, lms.n_vocab) == (64, 3, 32)
    assert found["lmstudio:acme/Tiny-GGUF/tiny-dflash.gguf"].is_drafter
    assert [d.name for d in lms.drafters] == ["tiny-dflash.gguf"]
    assert [d.name for d in found["jan:tiny"].drafters] == ["tiny-dflash.gguf"]
    assert found["jan:org/wide"].drafters == []                       # 96 wide: another hidden size
    assert found["hf:acme/Tiny-GGUF/q/other.gguf"].drafters == []     # 48 tokens: another vocabulary


def test_layer_count_must_fit(fake_home, tmp_path):
    shallow = write_tiny_llama(tmp_path / "shallow.gguf", n_layer=1)   # the drafter taps layer 2
    assert drafters_for(shallow) == []
    assert [p.name for p in drafters_for(fake_home / ".lmstudio" / "models" / "acme" / "Tiny-GGUF" /
                                         "tiny-f32.gguf")] == ["tiny-dflash.gguf"]


def test_resolve_names(fake_home):
    assert resolve_model("lmstudio:acme/Tiny-GGUF").name == "tiny-f32.gguf"
    assert resolve_model("lmstudio:acme/Tiny-GGUF/tiny-f32.gguf").name == "tiny-f32.gguf"
    assert resolve_model("lmstudio:acme/Tiny-GGUF", drafter=True).name == "tiny-dflash.gguf"
    assert resolve_model("jan:org/wide").name == "wide.gguf"
    assert resolve_model("hf:acme/Tiny-GGUF/q/other.gguf").name == "other.gguf"
    with pytest.raises(UserError, match="no such model"):
        resolve_model("lmstudio:acme/Missing")
    with pytest.raises(UserError, match="no such file"):
        resolve_model("nowhere/model.gguf")


def test_lmstudio_downloads_folder_from_settings(fake_home, tmp_path):
    elsewhere = tmp_path / "big-disk" / "models" / "pub" / "Big"
    elsewhere.mkdir(parents=True)
    write_tiny_llama(elsewhere / "big.gguf")
    (fake_home / ".lmstudio" / "settings.json").write_text(json.dumps({"downloadsFolder": str(elsewhere.parents[1])}))
    assert resolve_model("lmstudio:pub/Big") == elsewhere / "big.gguf"


def test_models_command(fake_home):
    from typer.testing import CliRunner

    from dflash_gguf.cli import app
    out = CliRunner().invoke(app, ["models"])
    assert out.exit_code == 0, out.output
    assert "lmstudio:acme/Tiny-GGUF  (llama, 3 layers, 64 wide, vocab 32)" in out.output
    assert "fits drafter:" in out.output and "jan:org/wide" in out.output
    listed = json.loads(CliRunner().invoke(app, ["models", "--json"]).output)
    assert {f["name"] for f in listed} >= {"lmstudio:acme/Tiny-GGUF", "jan:tiny"}
