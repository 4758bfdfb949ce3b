"""Validation τ counts what the engine counts: every anchor of a span is drafted, then the span is walked as
a greedy speculative run walks it (draft at p, accept k, continue at p + k + 1). No native layer needed."""

import numpy as np
import pytest

from dflash_gguf.engine.acceptance import Walk, leading_correct
from test_train_objective import MASK, _trainer, _write


def test_walk_counts_blocks_the_way_a_greedy_run_spends_target_calls():
    # span of 11 tokens: 10 positions with something left to draft
    runs = np.array([3, 0, 0, 0, 1, 0, 0, 7, 0, 0])
    w = Walk()
    w.add_span(runs, n_slots=3)
    # p=0: k=3 -> p=4; p=4: k=1 -> p=6; p=6: k=0 -> p=7; p=7: k=7 (only 3 slots, 3 left) -> p=15 (end)
    assert w.calls == 4 and w.tokens == 10 and w.tau == pytest.approx(10 / 4)
    # slot 1 tried 4 times, right 3 times; slot 2 tried after 3 hits of slot 1 ...
    assert w.slot_accept[0] == pytest.approx(3 / 4)
    anchor_mean = 1 + runs.clip(max=3).mean()
    assert anchor_mean != pytest.approx(w.tau)             # the two ways of counting differ on the same drafts


def test_leading_correct_stops_at_the_first_miss():
    right = np.array([[1, 1, 0, 1], [0, 1, 1, 1], [1, 1, 1, 1]], dtype=bool)
    np.testing.assert_array_equal(leading_correct(right), [2, 0, 4])


def test_anchor_blocks_cover_every_anchor_and_stop_labels_at_the_span_end(tmp_path):
    toks = list(range(2, 22))
    data = _write(tmp_path, [(toks, 10)])
    (anchors,) = data.walk_anchors(0)
    np.testing.assert_array_equal(anchors, np.arange(10, 19))
    pb = data.anchor_blocks(0, anchors, 4, MASK)
    for row in range(len(pb.slot)):
        a = pb.block_pos[row] - pb.slot[row]
        p = pb.block_pos[row]
        expect = -100 if pb.slot[row] == 0 or p >= len(toks) else toks[p]
        assert pb.labels[row] == expect
        np.testing.assert_array_equal(np.flatnonzero(pb.mask[row, :pb.ctx_feats.shape[0]]), np.arange(a))


def test_validation_of_a_perfect_drafter_walks_whole_blocks(tmp_path):
    """With drafts equal to the labels, each block accepts every slot left in the span: a span of L
    tokens takes ceil((L-1)/B) calls, so validation τ is (L-1)/ceil((L-1)/B) and the walk's slot acceptance 1."""
    import torch
    tr = _trainer(tmp_path)

    def perfect(pb, vocab=None):
        rows = torch.as_tensor(pb.slot > 0)
        labels = torch.as_tensor(pb.labels)[rows]
        logits = torch.full((len(labels), tr.n_vocab), -5.0)
        logits[torch.arange(len(labels)), labels.clamp(min=0)] = 5.0
        return logits, labels, torch.as_tensor(pb.slot)[rows]

    tr.forward = perfect
    result = tr.evaluate(max_seqs=2)
    # every sequence: 40 tokens, response from 8: 32 written, 31 positions to walk, block 4 = 3 slots
    assert result.tau == pytest.approx(31 / 8)               # ceil(31 / 4) = 8 calls
    assert result.slot_accept == [1.0, 1.0, 1.0]
    assert result.anchor_tau > result.tau                  # every anchor near a full block, walks end short


def test_short_training_blocks_are_what_a_shorter_block_computes(tmp_path):
    """A block cut to L rows in training gives its rows the logits a block of exactly L rows gives them,
    which is what the engine drafts on CPUs (n+1 rows for n tokens); rows past the cut carry no label."""
    import torch
    tr = _trainer(tmp_path)
    pb = tr.data.blocks(0, 6, 4, MASK, np.random.default_rng(0), short_share=1.0)
    rows_per_block = (pb.labels.reshape(-1, 4) >= 0).sum(axis=1) + 1
    assert set(rows_per_block.tolist()) <= {2, 3} and len(rows_per_block) == 6
    own = pb.mask[:, pb.ctx_feats.shape[0]:]
    for row in range(len(pb.slot)):
        start = row - pb.slot[row]
        visible = np.flatnonzero(own[row])
        np.testing.assert_array_equal(visible, np.arange(start, start + rows_per_block[row // 4]))
    r = tr.data.index[0]
    anchor = int(pb.block_pos[0])
    length = int(rows_per_block[0])
    cut = tr.data._pack(r, np.array([anchor]), np.array([length]), 4, MASK, hide_past=True)
    exact = tr.data._pack(r, np.array([anchor]), np.array([length]), length, MASK)
    with torch.no_grad():
        cut_logits, _, _ = tr.forward(cut)
        exact_logits, _, _ = tr.forward(exact)
    torch.testing.assert_close(cut_logits[:length - 1], exact_logits, rtol=1e-5, atol=1e-5)
