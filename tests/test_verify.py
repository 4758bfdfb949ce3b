"""Verification and the sampling transform, on synthetic logits (no native code)."""

import numpy as np
import pytest
from scipy import stats

from dflash_gguf.engine.sampling import SamplingParams, pick, probs_from_logits, sample
from dflash_gguf.engine.verify import verify_greedy, verify_stochastic


def test_greedy_accepts_longest_agreeing_prefix():
    #                draft d1..d4         target argmax at rows [last, d1, d2, d3, d4]
    v = verify_greedy([5, 7, 9, 11], np.array([5, 7, 8, 0, 0]))
    assert (v.n_accepted, v.next_token) == (2, 8)
    assert v.emitted([5, 7, 9, 11]) == [5, 7, 8]
    v = verify_greedy([5, 7], np.array([5, 7, 3]))          # all accepted: bonus from the last row
    assert (v.n_accepted, v.next_token) == (2, 3)
    v = verify_greedy([4], np.array([5, 6]))                 # first rejected: the target's own choice
    assert (v.n_accepted, v.next_token) == (0, 5)
    assert verify_greedy([], np.array([9])).emitted([]) == [9]


def test_transform_top_k_top_p_min_p():
    logits = np.log(np.array([[0.5, 0.25, 0.15, 0.1]]))
    p = probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=2))
    np.testing.assert_allclose(p, [[2 / 3, 1 / 3, 0, 0]])
    p = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=0.7))   # 0.5 + 0.25 crosses 0.7
    np.testing.assert_allclose(p, [[2 / 3, 1 / 3, 0, 0]])
    p = probs_from_logits(logits, SamplingParams(temperature=1.0, min_p=0.3))   # keep p >= 0.15
    np.testing.assert_allclose(p, [[0.5, 0.25, 0.15, 0]] / np.float64(0.9))
    p = probs_from_logits(logits, SamplingParams(temperature=0.0))
    np.testing.assert_array_equal(p, [[1, 0, 0, 0]])
    hot = probs_from_logits(logits, SamplingParams(temperature=2.0))
    assert hot[0, 3] > 0.1 and abs(hot.sum() - 1) < 1e-12
    with pytest.raises(ValueError):
        SamplingParams(temperature=1.0, top_p=0.0).validate()


def _reference_transform(logits, params):
    """The transform as first written: every row sorted whole (the definition the fast one must keep)."""
    x = np.atleast_2d(np.asarray(logits, dtype=np.float64)) / params.temperature
    keep = np.ones(x.shape, dtype=bool)
    if params.top_k and params.top_k < x.shape[1]:
        kth = np.partition(x, -params.top_k, axis=1)[:, -params.top_k][:, None]
        keep &= x >= kth
    x = np.where(keep, x, -np.inf)
    p = np.exp(x - x.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    if params.top_p < 1.0:
        order = np.argsort(-p, axis=1, kind="stable")
        sorted_p = np.take_along_axis(p, order, axis=1)
        mask = np.zeros(p.shape, dtype=bool)
        np.put_along_axis(mask, order, np.cumsum(sorted_p, axis=1) - sorted_p < params.top_p, axis=1)
        p = np.where(mask, p, 0.0)
    if params.min_p > 0.0:
        p = np.where(p >= params.min_p * p.max(axis=1, keepdims=True), p, 0.0)
    return (p / p.sum(axis=1, keepdims=True)).reshape(np.shape(logits))


@pytest.mark.parametrize("vocab", [7, 300, 5000])
def test_the_transform_keeps_what_a_whole_sort_keeps(vocab):
    """The transform works on candidates only (top-k's, then the largest probabilities top-p needs, cut by
    min-p): the same tokens kept and the same probabilities as sorting every row whole, over peaked and flat
    rows, tied logits (top-k's k-th value and top-p's order), and top-p prefixes far past its first 64
    candidates. Breaks if ties are broken another way, if top-p stops short or runs on, or if min-p cuts
    before top-p has counted the mass it removes."""
    rng = np.random.default_rng(vocab)
    rows = [rng.standard_normal(vocab) * scale for scale in (0.3, 3.0, 12.0)]
    rows.append(np.round(rng.standard_normal(vocab) * 2) / 2)          # many ties
    logits = np.stack(rows).astype(np.float32)
    checked = 0
    for temperature in (0.5, 1.0, 1.7):
        for top_k in (0, 1, 5, 40, vocab + 3):
            for top_p in (1.0, 0.99, 0.9, 0.5):
                for min_p in (0.0, 0.05, 0.3):
                    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
                    fast, ref = probs_from_logits(logits, params), _reference_transform(logits, params)
                    assert np.array_equal(fast > 0, ref > 0), params
                    np.testing.assert_allclose(fast, ref, rtol=1e-12, atol=0, err_msg=str(params))
                    checked += 1
    assert checked == 180
    flat = probs_from_logits(logits[0], SamplingParams(temperature=1.0, top_p=0.9))
    assert np.count_nonzero(flat) > min(256, vocab // 2)             # flat: the search grew past its first m


def test_pick_draws_the_token_a_draw_from_the_dense_row_gives():
    """`pick` draws among the kept columns only: for every setting and random number it returns the token that
    `sample` draws from the transform's dense row with the same generator state, and leaves the generator where
    that draw does. Breaks if it returns a position among the kept columns rather than its token, or draws in
    another order."""
    rng = np.random.default_rng(7)
    rows = [rng.standard_normal(3000) * scale for scale in (0.3, 3.0)]
    rows.append(np.round(rng.standard_normal(3000) * 2) / 2)
    checked = 0
    for row in np.stack(rows).astype(np.float32):
        for params in (SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
                       SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9),
                       SamplingParams(temperature=1.3, top_k=5), SamplingParams(temperature=0.5, min_p=0.1)):
            dense = probs_from_logits(row, params)
            for seed in range(40):
                a, b = np.random.default_rng(seed), np.random.default_rng(seed)
                token = pick(row, params, a)
                assert token == sample(dense, b) and dense[token] > 0, (params, seed)
                assert a.random() == b.random()
                checked += 1
    assert checked == 600


def _first_token_distribution(p, q, n, seed):
    """Empirical distribution of the first emitted token over n verifications of one draft slot."""
    rng = np.random.default_rng(seed)
    counts = np.zeros(p.shape[1])
    for _ in range(n):
        d = sample(q[0], rng)
        v = verify_stochastic([d], q, p, rng)
        counts[v.emitted([d])[0]] += 1
    return counts


@pytest.mark.parametrize("q_kind", ["far", "close", "one_hot"])
def test_rejection_sampling_preserves_the_target_distribution(q_kind):
    rng = np.random.default_rng(1)
    V = 12
    p = rng.dirichlet(np.ones(V), size=2)                     # rows [last, d1]
    if q_kind == "far":
        q = rng.dirichlet(np.ones(V) * 0.3, size=1)
    elif q_kind == "close":
        q = 0.9 * p[:1] + 0.1 * rng.dirichlet(np.ones(V), size=1)
    else:                                                     # greedy draft: sample-and-match
        q = np.zeros((1, V))
        q[0, rng.integers(V)] = 1.0
    n = 6000
    counts = _first_token_distribution(p, q, n, seed=2)
    res = stats.chisquare(counts, p[0] * n)
    assert res.pvalue > 0.01, (q_kind, res)
    # and a wrong target is detected: the test has power
    wrong = 0.7 * p[0] + 0.3 * np.roll(p[0], 1)
    assert stats.chisquare(counts, wrong * n).pvalue < 0.01


def test_all_accepted_draws_bonus_from_last_row():
    V = 5
    p = np.zeros((3, V))
    p[0, 1] = p[1, 2] = 1.0
    p[2] = [0.2, 0.2, 0.2, 0.2, 0.2]
    q = np.zeros((2, V))
    q[0, 1] = q[1, 2] = 1.0
    v = verify_stochastic([1, 2], q, p, np.random.default_rng(0))
    assert v.n_accepted == 2 and 0 <= v.next_token < V


def _first_two_tokens(p0, p1, q0, q1_of, q1_verified_of, n, seed):
    """Counts [V, V] of the first two emitted tokens over n blocks of two drafts, where the second draft is
    drawn from q1_of(d1) (a proposal that depends on the token drawn before, like the DFlash2 walk) and
    verification is handed q1_verified_of(d1). p0 [V], p1 [V, V]: the target's rows (p1[t] after t)."""
    rng = np.random.default_rng(seed)
    V = len(p0)
    counts = np.zeros((V, V))
    for _ in range(n):
        d1 = sample(q0, rng)
        d2 = sample(q1_of(d1), rng)
        q = np.stack([q0, q1_verified_of(d1)])
        p = np.stack([p0, p1[d1], np.full(V, 1 / V)])           # rows [last, d1, d2]; the bonus is not counted
        out = verify_stochastic([d1, d2], q, p, rng).emitted([d1, d2])
        if len(out) == 1:                                      # the next block's first token comes from p1
            out.append(sample(p1[out[0]], rng))
        counts[out[0], out[1]] += 1
    return counts


def test_rejection_sampling_is_exact_when_a_slot_depends_on_the_draw_before():
    """Two slots whose second proposal is conditioned on the first draft (the DFlash2 selector walk): the
    first two emitted tokens follow p0(t0) p1(t1 | t0) when verification divides by the q that drew each
    token, and the check tells it apart from dividing by the q of another predecessor."""
    rng = np.random.default_rng(3)
    V = 5
    p0, p1 = rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V), size=V)
    q0, q1 = rng.dirichlet(np.ones(V) * 0.5), rng.dirichlet(np.ones(V) * 0.5, size=V)
    expected = (p0[:, None] * p1).ravel()
    n = 20000
    counts = _first_two_tokens(p0, p1, q0, lambda d: q1[d], lambda d: q1[d], n, seed=4)
    assert stats.chisquare(counts.ravel(), expected * n).pvalue > 0.01
    wrong = _first_two_tokens(p0, p1, q0, lambda d: q1[d], lambda d: q1[int(np.argmax(q0))], n, seed=4)
    assert stats.chisquare(wrong.ravel(), expected * n).pvalue < 0.01
