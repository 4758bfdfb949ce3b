"""The drafter shipped for the embedded default: intact, documented, and actually good."""

import json

import pytest

from dflash_gguf.assets import ASSETS, manifest, shipped_drafter_for
from dflash_gguf.native.build import sha256_file
from dflash_gguf.packaged_models import smollm2

PROMPTS = [  # fixed, not from the training set
    ("chat", "Explain in a few sentences why the sky is blue."),
    ("math", "A farmer has 12 cows and buys 7 more, then sells 5. How many cows does the farmer have?"),
    ("code", "def is_palindrome(s):\n    \"\"\"Return True if s reads the same forwards and backwards.\"\"\"\n"),
]
TAU_FLOOR = 1.4     # measured here: random drafters 1.00; shipped drafters 1.32 (2026-11-23), 1.49, 1.52, 1.62 (now)


def test_manifest_hash_and_metadata():
    entries = manifest()
    assert len(entries) == 1, "exactly one shipped drafter, listed in dflash_gguf/assets/drafters.json"
    entry = entries[0]
    path = ASSETS / entry["file"]
    assert path.stat().st_size <= 20 * 2**20
    assert sha256_file(path) == entry["sha256"]
    assert shipped_drafter_for(smollm2()) == path
    from dflash_gguf.convert.inspect_drafter import inspect_drafter
    assert inspect_drafter(path)["draft_vocab"] == entry["draft_vocab"] == 4096
    from dflash_gguf.native.wrappers import Model
    m = Model(path)
    try:
        assert m.arch == "dflash" and m.block_size() == 8 and m.target_layer_ids() == entry["training"]["taps"]
        assert json.loads(m.meta("dflash_gguf.train.taps")) == entry["training"]["taps"]
        assert m.meta("dflash_gguf.train.target_sha256") == entry["target"]["sha256"] == sha256_file(smollm2())
        assert int(m.meta("dflash_gguf.train.steps")) == entry["training"]["steps"]
        settings = json.loads(m.meta("dflash_gguf.train.train_settings"))
        assert settings["seed"] == entry["training"]["seed"] and settings["block_size"] == 8
    finally:
        m.close()


@pytest.mark.slow
def test_shipped_drafter_beats_any_random_drafter_floor():
    from dflash_gguf.bench.tau import measure_tau
    target = smollm2()
    rows = [{"category": c, "prompt": p} for c, p in PROMPTS]
    report = measure_tau(shipped_drafter_for(target), target, rows, max_tokens=64, n_threads=2)
    assert report.overall > TAU_FLOOR, report.to_json()
