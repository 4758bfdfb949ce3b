"""A CPU context keeps the compute graphs of several batch shapes (patches/0017): the loop's alternating widths — a
plain decode, a verify of k+1 rows; the drafter's injection and its block — run a kept graph instead of building
one each time, with the same bits as a context that builds every graph afresh."""

from __future__ import annotations

import numpy as np
import pytest

from dflash_gguf.assets import shipped_drafter_for
from dflash_gguf.engine.drafter_driver import DrafterDriver
from dflash_gguf.native.wrappers import Batch, Context, ContextSettings, Model
from dflash_gguf.packaged_models import smollm2_q4_1

SETTINGS = ContextSettings(n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2)
WIDTHS = (1, 3, 2, 5)


@pytest.fixture(scope="module")
def target_model():
    model = Model(smollm2_q4_1(), devices=("none",))
    yield model
    model.close()


def _context(model: Model, monkeypatch, rebuild_every_graph: bool, **kw) -> Context:
    with monkeypatch.context() as m:       # read once, when the context is created
        if rebuild_every_graph:
            m.setenv("LLAMA_GRAPH_REUSE_DISABLE", "1")
        else:
            m.delenv("LLAMA_GRAPH_REUSE_DISABLE", raising=False)
        return Context(model, SETTINGS, **kw)


def _verify_rounds(model: Model, ctx: Context, rounds: int) -> tuple[list[np.ndarray], list[int]]:
    """Prefill a prompt, then verify batches of WIDTHS in turn, each rolled back as a rejected verify is; returns
    every batch's logits and the reuse count after each decode."""
    prompt = model.tokenize("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", add_special=False)
    batch = Batch(model.native, 64)
    batch.set_tokens(prompt, 0, "last")
    ctx.decode(batch)
    n_past = len(prompt)
    logits, reused = [], []
    for r in range(rounds):
        for w in WIDTHS:
            tokens = [prompt[(r * 7 + i) % len(prompt)] for i in range(w)]
            batch.set_tokens(tokens, n_past, "all")
            ctx.decode(batch)
            logits.append(np.array(ctx.logits_all(w)))
            reused.append(ctx.graphs_reused())
            ctx.seq_rm(n_past + 1, -1)               # keep one row: the context grows as a generation's does
            n_past += 1
    batch.close()
    return logits, reused


def test_alternating_widths_reuse_kept_graphs_with_the_same_bits(target_model, monkeypatch):
    kept = _context(target_model, monkeypatch, rebuild_every_graph=False)
    fresh = _context(target_model, monkeypatch, rebuild_every_graph=True)
    logits, reused = _verify_rounds(target_model, kept, rounds=4)
    expected, fresh_reused = _verify_rounds(target_model, fresh, rounds=4)
    assert fresh_reused[-1] == 0
    # the first round builds one graph per width; every later decode runs a kept one
    n = len(WIDTHS)
    assert reused[n - 1] - reused[0] <= 1
    assert np.diff(reused[n - 1:]).tolist() == [1] * (len(reused) - n)
    for i, (a, b) in enumerate(zip(logits, expected)):
        assert np.array_equal(a, b), f"decode {i} (width {WIDTHS[i % n]}): logits differ from a freshly built graph"
    kept.close()
    fresh.close()


def test_the_drafter_reuses_its_injection_and_block_graphs(target_model, monkeypatch):
    drafter_path = shipped_drafter_for(target_model.path)
    drafter_model = Model(drafter_path, devices=("none",))
    target = _context(target_model, monkeypatch, rebuild_every_graph=False)
    drafts = {}
    for rebuild in (False, True):
        monkeypatch.setenv("LLAMA_GRAPH_REUSE_DISABLE", "1" if rebuild else "0")
        driver = DrafterDriver(drafter_model, target, SETTINGS)
        features = np.random.default_rng(7).standard_normal((40, driver.width)).astype(np.float32)
        driver.inject(features[:32], 0)
        rows = []
        for pos in range(32, 40):
            driver.inject(features[pos:pos + 1], pos)
            driver.decode_block(1234, pos + 1, 4)
            rows.append(np.array(driver.logits(4)))
            driver.drop_block(pos + 1)
        drafts[rebuild] = (rows, driver.ctx.graphs_reused())
        driver.close()
    monkeypatch.delenv("LLAMA_GRAPH_REUSE_DISABLE")
    (rows, reused), (expected, fresh_reused) = drafts[False], drafts[True]
    assert fresh_reused == 0
    assert reused == 2 * 8 - 2          # every decode but the first of each shape (32-row and 1-row injection, block)
    for a, b in zip(rows, expected):
        assert np.array_equal(a, b)
    target.close()
    drafter_model.close()
