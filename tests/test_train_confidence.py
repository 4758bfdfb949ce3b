"""`train --confidence-head`: DeepSpec's confidence head on a DSpark drafter we train, sigmoid(proj([h; W1[prev]]))
learning whether each slot's argmax is the target's token given the true tokens before it. Torch only: it reads
the drafter without changing what the drafter learns (bit for bit), and it learns the acceptance rate. With the
native library (tests/test_train_markov.py): it exports, validates, and llama.cpp computes it as torch does."""

import numpy as np
import pytest

from test_train_data import MASK, _dataset, _random_seqs, _trainer

torch = pytest.importorskip("torch")
torch.set_num_threads(1)


def test_the_head_reads_the_drafter_and_changes_nothing_it_learns(tmp_path):
    data = _dataset(tmp_path, _random_seqs())
    plain = _trainer(data, markov_rank=8, rows=240, eval_every=10**9)
    with_head = _trainer(data, markov_rank=8, rows=240, eval_every=10**9, confidence_head=True)
    start = {k: v.clone() for k, v in with_head.model.confidence_head.state_dict().items()}
    plain.train(tmp_path / "plain", progress=False)
    with_head.train(tmp_path / "head", progress=False)
    a, b = plain.model.state_dict(), with_head.model.state_dict()
    assert set(b) - set(a) == {"confidence_head.proj.weight", "confidence_head.proj.bias"}
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert not all(torch.equal(v, with_head.model.confidence_head.state_dict()[k]) for k, v in start.items())


def test_the_head_learns_the_acceptance_rate(tmp_path):
    """On random data most slots are wrong: the confidences start near 0.5 and move to the drafter's rate."""
    data = _dataset(tmp_path, _random_seqs())
    tr = _trainer(data, markov_rank=8, rows=3000, lr=0.02, eval_every=10**9, confidence_head=True)
    pb = data.blocks(0, 6, 4, MASK, np.random.default_rng(0))

    def mean_confidence_and_rate():
        with torch.no_grad():
            logits, labels, _, conf = tr.forward(pb, with_confidence=True)
        return float(torch.sigmoid(conf).mean()), float((logits.argmax(-1) == labels).float().mean())

    before, _ = mean_confidence_and_rate()
    tr.train(tmp_path / "ck", progress=False)
    after, rate = mean_confidence_and_rate()
    print(f"confidence {before:.3f} -> {after:.3f}, acceptance {rate:.3f}")
    assert abs(before - 0.5) < 0.1 and rate < 0.4
    assert abs(after - rate) < abs(before - rate) / 2, (before, after, rate)


def test_a_confidence_head_needs_the_markov_head(tmp_path):
    from dflash_gguf.errors import UserError
    with pytest.raises(UserError, match="--markov-rank"):
        _trainer(_dataset(tmp_path, _random_seqs()), confidence_head=True)
