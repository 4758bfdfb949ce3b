"""dflash-gguf inspect: geometry, DFlash settings, training metadata, and the fit against a target."""

import json
import subprocess
import sys

import pytest

from helpers.convert import random_drafter, state_numpy, write_flavoured_gguf
from dflash_gguf.convert.flavours import FLAVOURS
from dflash_gguf.convert.inspect_drafter import inspect_drafter
from dflash_gguf.convert.writer import write_dflash_gguf
from dflash_gguf.errors import UserError
from helpers.engine import TINY_DRAFTER, write_tiny_llama

pytest.importorskip("torch")
CONFIG = TINY_DRAFTER


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("inspect")
    target = write_tiny_llama(d / "target.gguf", n_vocab=64, n_embd=64, n_layer=3)
    drafter = write_dflash_gguf(state_numpy(random_drafter(CONFIG)), CONFIG, target, d / "draft.gguf", outtype="q8_0",
                                extra_metadata={"dflash_gguf.train.steps": 1200, "dflash_gguf.train.val_loss": 2.5,
                                                "dflash_gguf.train.data": "docstrings"})
    return target, drafter


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "dflash_gguf.cli", "inspect", *map(str, args)],
                          capture_output=True, text=True)


def test_report_without_target(files):
    _, drafter = files
    r = inspect_drafter(drafter)
    assert r["flavour"] == "upstream" and r["layers"] == 2 and r["hidden_size"] == 64
    assert r["heads"] == "4 q / 2 kv x 16" and r["target_layers"] == [1, 3] and r["block_size"] == 8
    assert r["mask_token_id"] == 5 and r["parameters"] == sum(t.size for t in state_numpy(random_drafter(CONFIG)).values())
    assert r["training"] == {"steps": 1200, "val_loss": 2.5, "data": "docstrings"}
    assert "fits_target" not in r


def test_cli_text_and_json_with_a_target(files):
    target, drafter = files
    r = _cli(drafter, "--target", target)
    assert r.returncode == 0, r.stderr
    assert "target_layers: [1, 3]" in r.stdout and "train.steps: 1200" in r.stdout and "fits_target: True" in r.stdout
    r = _cli(drafter, "--target", target, "--json")
    report = json.loads(r.stdout)
    assert report["fits_target"] is True and report["warnings"] == [] and report["training"]["val_loss"] == 2.5


def test_fit_against_another_target(files, tmp_path):
    _, drafter = files
    other = write_tiny_llama(tmp_path / "other.gguf", n_vocab=64, n_embd=96, n_layer=2, n_head=4)
    r = inspect_drafter(drafter, other)
    assert r["fits_target"] is False
    assert "hidden size 64 != target hidden size 96" in r["fit_problem"] and "out of range" in r["fit_problem"]
    assert r["warnings"] == ["the drafter names 'target' as its target, this target is 'other'",
                             "the drafter was built for a 3-layer target, this one has 2"]


def test_inspect_a_fork_file_without_layer_ids(files, tmp_path):
    _, drafter = files
    luce = next(f for f in FLAVOURS if f.name == "gemma4-dflash-draft")
    r = inspect_drafter(write_flavoured_gguf(drafter, tmp_path / "g.gguf", luce, with_ids=False))
    assert r["flavour"] == "gemma4-dflash-draft" and r["target_layers"] == []
    assert any("no target layer ids" in n for n in r["notes"])


def test_inspect_refuses_a_target_model(files):
    target, _ = files
    with pytest.raises(UserError, match="not a DFlash drafter"):
        inspect_drafter(target)
    r = _cli(target)
    assert r.returncode == 2 and "not a DFlash drafter" in r.stderr
