"""The drafter's probabilities as acceptance chances (engine/confidence.py) and how the policy trims by them."""

import numpy as np

from dflash_gguf.engine.confidence import ConfidenceCalibration, top_probabilities
from dflash_gguf.engine.cost import CostCurve
from dflash_gguf.engine.policy import DraftLengthPolicy


def _softmax_max(row: np.ndarray) -> float:
    e = np.exp(row.astype(np.float64) - row.max())
    return float(e.max() / e.sum())


def test_top_probabilities_equal_a_float64_softmax_and_read_only_the_draft_vocabulary():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (5, 300)).astype(np.float32)
    expected = [_softmax_max(r) for r in logits]
    np.testing.assert_allclose(top_probabilities(logits), expected, rtol=1e-5)
    columns = np.sort(rng.choice(300, 40, replace=False))
    reduced = np.full_like(logits, -np.inf)
    reduced[:, columns] = logits[:, columns]
    expected = [_softmax_max(r[columns]) for r in logits]
    np.testing.assert_allclose(top_probabilities(reduced[:, columns]), expected, rtol=1e-5)   # head-order rows
    np.testing.assert_allclose(top_probabilities(reduced), expected, rtol=1e-5)    # -inf columns add nothing


def test_calibration_starts_at_the_bin_centres_and_learns_each_bins_rate():
    cal = ConfidenceCalibration()
    np.testing.assert_allclose(cal(np.array([0.03, 0.55, 0.97, 1.0])), [0.05, 0.55, 0.95, 0.95])
    cal = ConfidenceCalibration(decay=0.9995)         # a long memory: the rates, not the decay's noise
    rng = np.random.default_rng(1)
    for _ in range(3000):                          # an overconfident drafter: 0.9-1.0 accepted 40 %, 0.1-0.2 60 %
        cal.record(0.95, rng.random() < 0.4)
        cal.record(0.15, rng.random() < 0.6)
    low, high = cal(np.array([0.15, 0.95]))
    assert abs(high - 0.4) < 0.05 and abs(low - 0.6) < 0.05, (low, high)
    assert cal(np.array([0.55]))[0] == 0.55        # a bin with no evidence keeps its prior


def test_a_step_counts_the_slots_up_to_the_first_rejection_and_the_first_unverified_one_at_greedy():
    cal = ConfidenceCalibration(decay=1.0)
    probs = np.array([0.95, 0.85, 0.75, 0.65])
    cal.record_step(probs, n_verified=3, n_accepted=1)          # slot 1 accepted, slot 2 rejected, slot 3 unknown
    assert cal.tried.tolist() == [0] * 8 + [1, 1] and cal.accepted.tolist() == [0] * 9 + [1]
    cal.record_step(probs, n_verified=2, n_accepted=2, next_agrees=False)   # slot 3 left out: it would have failed
    assert cal.tried[7] == 1 and cal.accepted[7] == 0
    cal.record_step(probs, n_verified=2, n_accepted=1, next_agrees=True)    # a rejection inside: slot 3 unknown
    assert cal.tried[7] == 1


def test_trim_reads_the_calibrated_chances():
    """Raw probabilities of 0.95 that are accepted a tenth of the time are not worth a verify row."""
    cost = CostCurve({1: 1.0, 2: 1.2, 4: 1.6, 8: 3.0}, t_draft=0.2)
    policy = DraftLengthPolicy(7, cost=cost)
    policy.calibration = ConfidenceCalibration()
    sure = np.full(7, 0.95)
    assert policy.trim(sure) >= 4
    for _ in range(500):
        policy.calibration.record(0.95, False)
    assert policy.trim(sure) == 0


def test_a_drafter_whose_every_draft_is_trimmed_away_is_no_longer_called():
    """Each call pays its draft and verifies nothing, so α never moves: the share of emptied calls must stop the
    drafting, or the policy would pay a draft at every step for a plain step's token."""
    cost = CostCurve({1: 1.0, 2: 1.2, 4: 1.6, 8: 3.0}, t_draft=0.2)
    policy = DraftLengthPolicy(7, cost=cost, probe_every=16)
    policy.use_confidence = True
    assert policy.choose() > 0
    calls = 0
    for _ in range(200):
        n = policy.choose()
        if n:
            calls += 1
            policy.observe(0, 0, verify_s=1.0, draft_s=0.2, draft_n=n)
        else:
            policy.observe(0, 0, verify_s=1.0)
    assert policy.choose() == 0 and calls < 100, calls
