"""One driver of the drafter's forward pass (engine/drafter_driver.py): `bench --tau` drafts what the engine's
DFlash source drafts at the same anchor after the same context, so τ measures the drafter the engine runs."""

from __future__ import annotations

import numpy as np

from helpers.engine import write_random_drafter, write_tiny_llama


def test_tau_probe_drafts_what_the_engine_source_drafts(tmp_path):
    """Bit for bit, at anchors on both sides of a 64-row injection chunk. Breaks if the probe reads other block
    rows than the engine (e.g. rows 0..B-2), injects other context (a position missed or repeated at a chunk
    edge), or anchors the block elsewhere."""
    from dflash_gguf.bench.tau import NativeDraftProbe
    from dflash_gguf.engine.sources.dflash import DFlashSource
    from dflash_gguf.native.wrappers import ContextSettings, Model

    target = write_tiny_llama(tmp_path / "tiny.gguf", text=True, n_layer=3)
    drafter = write_random_drafter(target, tmp_path / "draft.gguf", taps=[1, 2], block_size=8, n_head=4,
                                   n_head_kv=2, head_dim=16, n_ff=64)
    probe = NativeDraftProbe(target, drafter, n_threads=1)
    settings = ContextSettings(n_ctx=probe.N_CTX, n_batch=64, n_ubatch=64, n_threads=1)
    source = DFlashSource(Model(drafter), probe.tctx, settings, probe.target)
    try:
        prompt = [1] + [(7 * i) % 30 + 2 for i in range(70)]
        seq, feats = probe.continuation(prompt, 24)
        anchors = [3, 40, 64, 65, 80, len(seq) - 2]
        by_probe, by_engine, held = [], [], 0
        source.begin()
        for p in anchors:                       # the loop's order: the rows before each anchor, then its block
            drafts = probe.draft_at(seq, feats, p)
            by_probe.append(np.array(probe.driver.logits(probe.block))[1:])     # [B-1, V] rows of those drafts
            assert drafts.tolist() == by_probe[-1].argmax(axis=1).tolist()
            source.process(feats[held:p], held)
            held = p
            by_engine.append(source.draft(seq[p], p, probe.block - 1, want_logits=True).logits)
        for p, a, b in zip(anchors, by_probe, by_engine):
            assert np.array_equal(a, b), f"anchor {p}: the probe's draft logits differ from the engine's"
        assert not np.array_equal(by_probe[0], by_probe[-1]), "the logits do not depend on the anchor"
    finally:
        source.close()
        source.model.close()
        probe.close()


def test_a_tap_of_the_final_output_is_right_for_every_prompt_row(tmp_path):
    """llama.cpp computes the last layer for output rows only, so a tap of the final output (id n_layer) is right
    for every row only when every row is an output row (Context.outputs_for_taps). The features of a prompt from
    one prefill (`prefill_features`: bench --tau, refeature, preflight) equal those of a verify that outputs every
    row. Broken variant caught: the prefill asking for the last row only (its other rows' final-output taps are
    not computed; they differed by up to ~3 in the tiny llama)."""
    from dflash_gguf.native.wrappers import Batch, Context, ContextSettings, Model
    from dflash_gguf.textgen.greedy import prefill_features

    path = write_tiny_llama(tmp_path / "tiny.gguf", text=True, n_layer=3)
    model = Model(path)
    taps = [1, model.n_layer]
    ctx = Context(model, ContextSettings(n_ctx=256, n_batch=128, n_ubatch=128, n_threads=1))
    batch = Batch(model.native, 128)
    try:
        seq = [1] + [(7 * i) % 30 + 2 for i in range(90)]
        feats = prefill_features(ctx, batch, taps, seq)
        ctx.clear()
        batch.set_tokens(seq, 0, "all")
        ctx.decode(batch, "verify")
        assert np.array_equal(feats, ctx.get_taps(0, len(seq)))
    finally:
        batch.close()
        ctx.close()
