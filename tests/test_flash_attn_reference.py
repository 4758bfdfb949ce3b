"""CPU flash attention (patches/0012, 0023) against a float64 reference, through ggml itself.

The exactness tests compare a verify row with the same token decoded alone: both go through our kernel, so an error
that every width shares (a visible position dropped, a hidden one counted) would pass them. Here one FLASH_ATTN_EXT
op, as a decode or a verify runs it on llama.cpp's cache layout, is compared with float64 softmax attention of the
same inputs, on every instruction-set variant this CPU runs and on ggml's stock kernel:
- short contexts in a cache padded past them (llama.cpp pads the cells it attends to 256), where the op stops at
  the last visible tile (patches/0023), and longer ones split over the threads in chunks of positions;
- the hidden cells hold large stale values, so counting one of them shows;
- the head shapes of SmolLM2 (9 query heads on 3 K/V heads), a Qwen3 ~2B (16 on 8) and Gemma 3 270M (4 on 1).
"""

from __future__ import annotations

import numpy as np
import pytest

from lab.attention_probe import AttentionProbe, reference

HEADS = {"smollm2": (64, 9, 3), "qwen3-2b": (128, 16, 8), "gemma3": (256, 4, 1)}
# (cache cells, positions the last row sees): inside the first tile, across tiles, past a chunk of 128, all of them
CONTEXTS = [(256, 40), (256, 65), (256, 130), (512, 300), (256, 256)]
ROWS = [1, 3, 8, 16]
TOLERANCE = 2e-5        # ours: float32 sums of at most 512 positions against float64
STOCK_TOLERANCE = 5e-3  # ggml's stock kernel sums V in fp16 where the cache is fp16


def _inputs(rng, head_dim, n_head, n_head_kv, n_kv, seen, n_rows):
    """A causal verify of n_rows at the end of `seen` positions; hidden cells hold stale values far from the rest."""
    q = rng.uniform(-1, 1, (n_rows, n_head, head_dim)).astype(np.float16)   # stock rounds q to the cache's fp16
    k = rng.uniform(-1, 1, (n_kv, n_head_kv, head_dim))
    v = rng.uniform(-1, 1, (n_kv, n_head_kv, head_dim))
    k[seen:] = 30.0
    v[seen:] = 100.0
    visible = np.arange(n_kv)[None, :] <= (seen - n_rows + np.arange(n_rows))[:, None]
    return q, k, v, visible


@pytest.fixture(scope="module")
def probes(native):
    made = {}

    def get(heads, n_kv, n_rows):
        key = (heads, n_kv, n_rows)
        if key not in made:
            made[key] = AttentionProbe(native, *HEADS[heads], n_kv, n_rows)
        return made[key]

    yield get
    for p in made.values():
        p.close()


@pytest.mark.parametrize("heads", sorted(HEADS))
@pytest.mark.parametrize("n_kv,seen", CONTEXTS)
def test_flash_attention_matches_a_float64_reference(probes, kernels, heads, n_kv, seen):
    rng = np.random.default_rng(n_kv * 1000 + seen)
    chosen = kernels.isa
    try:
        for n_rows in ROWS:
            probe = probes(heads, n_kv, n_rows)
            q, k, v, visible = _inputs(rng, *HEADS[heads], n_kv, seen, n_rows)
            probe.set_inputs(q, k, v, visible)
            want = reference(q, k, v, visible)
            runs = {"stock": probe.compute(2, use_ref=True)}
            for isa in [i for i in kernels.runnable() if i != "none"]:   # none: the stock kernel again
                assert kernels.set_isa(isa)
                for n_threads in (1, 2, 3):
                    runs[f"{isa}, {n_threads} threads"] = probe.compute(n_threads)
            for name, got in runs.items():
                err = float(np.abs(got - want).max())
                limit = STOCK_TOLERANCE if name == "stock" else TOLERANCE
                assert err < limit, f"{heads}, {n_rows} rows after {seen} of {n_kv} cells, {name}: max error {err:.2e}"
    finally:
        kernels.set_isa(chosen)


def test_a_position_the_op_skips_would_show(probes):
    """The reference tells a dropped visible position from rounding: without the last visible one it is far off."""
    q, k, v, visible = _inputs(np.random.default_rng(7), *HEADS["smollm2"], 256, 65, 1)
    short = visible.copy()
    short[:, 64] = False
    assert np.abs(reference(q, k, v, short) - reference(q, k, v, visible)).max() > 100 * TOLERANCE
