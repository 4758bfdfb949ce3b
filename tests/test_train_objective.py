"""The DFlash training objective on a hand-made dataset: block packing and its attention mask, the
restricted-vocabulary loss, a growing dataset, and the learning-rate schedule. No native layer needed."""

import numpy as np
import pytest

from dflash_gguf.train.dataset import FeatureDataset
from dflash_gguf.train.harvest import DatasetWriter

H, TAPS, V, MASK = 16, [1, 2], 40, 1


META = {"target": "t.gguf", "taps": TAPS, "n_embd": H, "store_features": True, "top_k_probs": 0}


def _write(folder, seqs):
    w = DatasetWriter(folder, META)
    rng = np.random.default_rng(0)
    for i, (tokens, response_start) in enumerate(seqs):
        w.add(tokens, [[response_start, len(tokens)]], {"category": "chat"}, prompt_index=i, sampled=False,
              feats=rng.standard_normal((len(tokens), len(TAPS) * H)))
    return FeatureDataset(folder)


def test_blocks_see_context_strictly_before_their_anchor_and_only_their_own_block(tmp_path):
    toks = list(range(2, 32))
    data = _write(tmp_path, [(toks, 10)])
    pb = data.blocks(0, n_anchors=5, block_size=4, mask_token=MASK, rng=np.random.default_rng(1))
    anchors = pb.block_pos[pb.slot == 0]
    assert len(anchors) == 5 and anchors.min() >= 10 and anchors.max() <= len(toks) - 4
    C = pb.ctx_feats.shape[0]
    assert C == anchors.max()
    np.testing.assert_array_equal(pb.ctx_feats, data.feats[:C])
    for row in range(len(pb.slot)):
        a = pb.block_pos[row] - pb.slot[row]
        assert pb.block_tokens[row] == (toks[a] if pb.slot[row] == 0 else MASK)
        assert pb.labels[row] == (-100 if pb.slot[row] == 0 else toks[pb.block_pos[row]])
        ctx_seen = np.flatnonzero(pb.mask[row, :C])
        np.testing.assert_array_equal(ctx_seen, np.arange(a))              # strictly before the anchor
        own = np.flatnonzero(pb.mask[row, C:])
        np.testing.assert_array_equal(own, np.arange(row - pb.slot[row], row - pb.slot[row] + 4))


def test_sequence_shorter_than_a_block_after_its_prompt_gives_no_blocks(tmp_path):
    data = _write(tmp_path, [(list(range(2, 14)), 10)])
    assert data.blocks(0, 4, 4, MASK, np.random.default_rng(0)) is None


def test_refresh_sees_sequences_written_later_and_ignores_an_unindexed_tail(tmp_path):
    data = _write(tmp_path, [(list(range(2, 30)), 4)] * 3)
    assert len(data.index) == 3
    w = DatasetWriter(tmp_path, META)
    w.add(list(range(5, 25)), [[3, 20]], {"category": "code"}, prompt_index=3, sampled=True,
          feats=np.zeros((20, len(TAPS) * H)))
    with open(tmp_path / "tokens.bin", "ab") as f:       # a writer caught mid-sequence
        f.write(np.arange(7, dtype=np.int32).tobytes())
    assert data.refresh() == 4
    assert data.tokens.shape[0] == 3 * 28 + 20 and data.feats.shape == (3 * 28 + 20, len(TAPS) * H)
    assert set(data.vocabulary().tolist()) == set(range(2, 30))


def _trainer(tmp_path, **settings):
    pytest.importorskip("torch")
    from dflash_gguf.drafter.config import DrafterConfig
    from dflash_gguf.train.trainer import Trainer, TrainSettings
    rng = np.random.default_rng(3)
    seqs = [(rng.integers(2, 20, size=40).tolist(), 8) for _ in range(21)]
    data = _write(tmp_path, seqs)
    cfg = DrafterConfig(hidden_size=H, intermediate_size=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8,
                        target_layers=TAPS, block_size=4, mask_token_id=MASK, vocab_size=V)
    embed = rng.standard_normal((V, H)).astype(np.float32)
    head = rng.standard_normal((V, H)).astype(np.float32)
    return Trainer(data, cfg, embed, head, TrainSettings(n_layers=1, block_size=4, **settings))


def test_restricted_vocabulary_keeps_the_logits_of_its_tokens_and_remaps_labels(tmp_path):
    import torch
    tr = _trainer(tmp_path, loss_vocab_extra=5)
    assert set(tr.data_vocab.tolist()) == set(range(2, 20))
    vocab = tr._loss_vocab()
    assert len(vocab) == len(set(vocab.tolist())) and set(range(2, 20)) <= set(vocab.tolist())
    pb = tr.data.blocks(0, 6, 4, MASK, np.random.default_rng(0))
    with torch.no_grad():
        full, labels, slots = tr.forward(pb)
        part, part_labels, part_slots = tr.forward(pb, vocab)
    torch.testing.assert_close(part, full[:, torch.as_tensor(vocab)])
    assert torch.equal(torch.as_tensor(vocab)[part_labels], labels) and torch.equal(slots, part_slots)
    assert slots.min() == 1                       # the anchor slot carries no loss
    assert tr.weights[0] == 0 and tr.weights[1] == 1 and tr.weights[2] < 1


def test_schedule_warms_up_then_reaches_zero_at_the_end_of_the_rows_budget(tmp_path):
    tr = _trainer(tmp_path, lr=1e-3, warmup=0.1, rows=1000)
    assert tr.total_rows == 1000
    assert tr.lr_at(0) == pytest.approx(1e-5) and tr.lr_at(99) == pytest.approx(1e-3)
    assert tr.lr_at(550) == pytest.approx(5e-4, rel=0.01) and tr.lr_at(1000) == pytest.approx(0, abs=1e-12)
    by_epochs = _trainer(tmp_path / "b", epochs=2.0)
    assert by_epochs.total_rows == 2 * by_epochs.data.n_tokens(by_epochs.train_ids) * 3     # block 4: 3 labels
