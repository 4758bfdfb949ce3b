"""Draft-length policy: pick the n with the best expected tokens per second, or plain decoding."""

import numpy as np
import pytest

from dflash_gguf.engine.cost import CostCache, CostCurve, measure_cost_curve
from dflash_gguf.engine.policy import DraftLengthPolicy, SlotAcceptance


def _feed(policy: DraftLengthPolicy, accepted_len: int, steps: int = 200) -> None:
    for _ in range(steps):
        policy.observe(policy.draft_max, accepted_len)


def test_expected_tokens_from_slot_acceptance():
    s = SlotAcceptance(3, prior_weight=0.0, decay=1.0)
    s.update(3, 3)
    s.update(3, 1)
    # slot 1: 2/2, slot 2: 1/2 (tried twice: accepted once, rejected once), slot 3: 1/1
    np.testing.assert_allclose(s.alpha(), [1.0, 0.5, 1.0])
    p = DraftLengthPolicy(3, cost=CostCurve({1: 1.0, 8: 1.0}, t_draft=0.0))   # every step costs t(1)
    p.slots = s
    rates = p.expected_rates(alpha1=1.0)                  # tokens per second = E(n) here
    assert [rates[n] for n in range(4)] == pytest.approx([1.0, 2.0, 2.5, 3.0])


def test_flat_cost_and_high_acceptance_drafts_long():
    p = DraftLengthPolicy(7, cost=CostCurve({1: 1.0, 8: 1.1}, t_draft=0.1))
    _feed(p, 7)
    assert p.choose() == 7


def test_steep_cost_and_low_acceptance_falls_back_to_plain():
    # CPU-like curve (t(8) = 4.3 t(1)) and drafts that are almost never accepted
    p = DraftLengthPolicy(7, cost=CostCurve({1: 1.0, 2: 1.6, 4: 2.4, 8: 4.3}, t_draft=0.4), probe_every=10)
    _feed(p, 0)
    choices = [p.choose() for _ in range(30)]
    assert choices.count(0) >= 25 and p.last_reason.startswith(("plain", "probe"))
    assert any(c > 0 for c in choices)          # probes keep the estimate fresh


def test_intermediate_acceptance_picks_a_middle_length():
    p = DraftLengthPolicy(7, cost=CostCurve({1: 1.0, 2: 1.3, 4: 2.0, 8: 4.0}, t_draft=0.2))
    _feed(p, 2)                                 # slots 1-2 accepted, slot 3 always rejected
    assert 1 <= p.choose() <= 3


def test_fixed_policy_ignores_costs():
    p = DraftLengthPolicy(5, adaptive=False, cost=CostCurve({1: 1.0, 8: 100.0}, t_draft=10.0))
    _feed(p, 0)
    assert p.choose() == 5


def test_cost_cache_round_trip(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 10)
    cache = CostCache(tmp_path / "c.json")
    key = CostCache.key(model, "cpu", 2, 0, model)
    assert cache.get(key) is None
    cache.put(key, CostCurve({1: 0.01, 4: 0.02}, 0.005))
    got = cache.get(key)
    assert got.t == {1: 0.01, 4: 0.02} and got.t_draft == 0.005
    assert cache.get(CostCache.key(model, "cpu", 4, 0, model)) is None   # other thread count: measured anew


def test_cost_curve_is_monotone_and_measured_in_rounds():
    curve = CostCurve({1: 1.0, 2: 0.9, 4: 2.0}, t_draft=0.1)     # a noisy t(2) below t(1)
    assert curve.verify(2) == 1.0 and curve.verify(3) == 1.5 and curve.verify(4) == 2.0
    order = []
    measured = measure_cost_curve(lambda b: order.append(b) or float(b), lambda n, short: order.append("d") or 0.5,
                                  sizes=(1, 2, 4), repeats=3)
    # each round: the sizes back to back, then as the loop runs a draft: a target decode, the draft, its verify
    # right after it; then the full block after a target decode
    assert order == ([1, 2, 4, "d", 1, "d", 2, "d", 1, "d"] + [1]) * 2 + [1, 2, 4, "d", 1, "d", 2, "d", 1, "d"]
    assert measured.t == {1: 1.0, 2: 2.0, 4: 4.0} and measured.t_draft == 0.5 and measured.t_cold == {2: 2.0}
    assert measure_cost_curve(lambda b: float(b), None, sizes=(1, 2)).t_cold == {}     # no drafter: verifies only


def test_a_verify_right_after_a_draft_is_timed_apart_from_one_after_a_verify():
    last = []

    def verify(b):                     # the target's weights were evicted by the drafter: 40 % dearer
        cost = b * (1.4 if last and last[-1] == "draft" else 1.0)
        last.append("verify")
        return cost

    curve = measure_cost_curve(verify, lambda n, short: last.append("draft") or 0.1, sizes=(1, 2, 4),
                               draft_ns=(1, 3), draft_max=3)
    assert curve.t == {1: 1.0, 2: 2.0, 4: 4.0} and curve.t_cold == {2: 2.8, 4: 5.6}
    assert curve.verify(2) == 2.0 and curve.verify(2, cold=True) == 2.8


def test_short_blocks_where_the_draft_cost_grows_with_rows():
    def verify(b):
        return 1.0 + 0.1 * b

    cpu = measure_cost_curve(verify, lambda n, short: 0.1 * (n + 1) if short else 0.8, sizes=(1, 2, 8),
                             draft_ns=(1, 2, 7), draft_max=7)
    assert cpu.short_blocks and cpu.draft(1) == pytest.approx(0.2) and cpu.draft(7) == pytest.approx(0.8)
    gpu = measure_cost_curve(verify, lambda n, short: 0.3, sizes=(1, 2, 8), draft_ns=(1, 2, 7), draft_max=7)
    assert not gpu.short_blocks and gpu.draft(1) == gpu.t_draft == 0.3
    assert CostCurve.from_json(cpu.to_json()) == cpu
    # cheap short drafts make a 1-token draft worth it where a full-block draft is not
    policy = DraftLengthPolicy(7, cost=cpu)
    for _ in range(40):
        policy.observe(1, 0)
        policy.observe(1, 1)                         # α1 ≈ 0.5
    assert policy.choose() >= 1
    full = DraftLengthPolicy(7, cost=CostCurve(dict(cpu.t), 0.8))
    full.slots = policy.slots
    assert full.choose() == 0


def test_a_row_more_costs_a_cold_verify_at_least_what_it_costs_a_warm_one():
    # t_cold(2) left from a slower spell, t_cold(3) timed since: two drafts must not look as cheap as one
    curve = CostCurve({1: 1.0, 2: 1.1, 3: 1.2, 4: 1.3}, 0.2, t_cold={2: 1.3, 3: 1.31})
    assert curve.verify(2, cold=True) == pytest.approx(1.3)
    assert curve.verify(3, cold=True) == pytest.approx(1.4)
    assert curve.verify(4, cold=True) == pytest.approx(1.5)
    assert curve.verify(3) == pytest.approx(1.2)               # warm prices as they were


def _cold_price_by_definition(curve: CostCurve, b: int) -> float:
    """A cold verify of b rows: the cold curve, at least the warm one, and at least the warm one plus what any
    smaller cold size costs above the warm curve (each made non-decreasing in the size, interpolated linearly)."""
    def interp(table, x):
        points, top = [], None
        for k in sorted(table):
            top = table[k] if top is None else max(top, table[k])
            points.append((k, top))
        below = [(k, v) for k, v in points if k < x]
        above = [(k, v) for k, v in points if k >= x]
        if not below or not above:
            return (above or below)[0 if above else -1][1]
        (k0, v0), (k1, v1) = below[-1], above[0]
        return v0 + (v1 - v0) * (x - k0) / (k1 - k0)
    warm = interp(curve.t, b)
    extras = [curve.t_cold[k] - interp(curve.t, k) for k in curve.t_cold if k < b]
    return max([interp(curve.t_cold, b), warm] + [warm + e for e in extras])


def test_cold_prices_equal_their_definition_on_random_tables():
    # the prices are computed in one walk per table; on any tables they equal the size-by-size definition
    rng = np.random.default_rng(7)
    for _ in range(500):
        warm = {int(k): float(v) for k, v in zip(rng.choice(np.arange(2, 34), rng.integers(0, 9), replace=False),
                                                  rng.uniform(0.5, 10, 9))}
        cold = {int(k): float(v) for k, v in zip(rng.choice(np.arange(2, 20), rng.integers(1, 7), replace=False),
                                                  rng.uniform(0.5, 12, 7))}
        curve = CostCurve({1: float(rng.uniform(0.5, 2)), **warm}, 0.2, t_cold=cold)
        sizes = [int(b) for b in rng.choice(np.arange(1, 40), 9, replace=False)]
        assert curve.verify_sizes(sizes, cold=True) == [_cold_price_by_definition(curve, b) for b in sizes]


def test_a_lookup_verify_past_the_drafters_sizes_keeps_its_prices():
    # the drafter's prices read the warm curve up to draft_max + 1 = 8 rows: a lookup verify of 12 rows leaves
    # them (kept, not weighed again), one of 4 rows moves them; either way they are what a fresh weighing gives
    policy = DraftLengthPolicy(7, cost=CostCurve({1: 1.0, 2: 1.2, 4: 1.5, 8: 2.2, 16: 3.9}, 0.2,
                                                 t_cold={2: 1.4, 8: 2.5}), lookup_max=15)
    policy.use_lookup(4)
    policy.expected_rates(0.5)
    for rows, kept in ((12, True), (16, True), (4, False), (8, False)):
        before = policy._step_prices()
        policy.observe(rows - 1, 0, verify_s=policy.cost.t[4] * 2.0, lookup=True)
        cached = policy._step_prices()
        assert (cached is before) == kept
        policy._prices_key = None
        fresh = policy._step_prices()       # equal but for rounding: the verify also lowered t(1), moving all alike
        assert fresh[0] == pytest.approx(cached[0], rel=1e-12) and fresh[1] == cached[1]
        policy.expected_rates(0.5)


@pytest.mark.parametrize("t1,full,short,chosen", [
    (7.0, 1.30, 0.93, True),     # Zen 4, shipped drafter: 0.72 of a full block, 5 % of t(1) saved
    (7.0, 1.30, 1.10, False),    # 3 % of t(1): not worth the full block's acceptance
    (2.0, 0.50, 0.45, False),    # a GPU: rows nearly free
])
def test_short_blocks_where_they_save_a_share_of_a_plain_step(t1, full, short, chosen):
    curve = measure_cost_curve(lambda b: t1 * (1 + 0.1 * (b - 1)),
                               lambda n, is_short: short + 0.01 * (n - 1) if is_short else full,
                               sizes=(1, 2, 8), draft_ns=(1, 7), draft_max=7)
    assert curve.short_blocks is chosen


def test_probes_are_short_and_back_off_while_plain_wins():
    steep = CostCurve({1: 1.0, 2: 3.0, 8: 20.0}, t_draft=0.5)
    policy = DraftLengthPolicy(7, cost=steep, probe_every=4)
    for _ in range(3):
        policy.observe(7, 0)                         # nothing accepted: plain decoding wins
    picks = []
    for _ in range(60):
        n = policy.choose()
        picks.append(n)
        if n:
            policy.observe(n, 0)
    probes = [i for i, n in enumerate(picks) if n]
    assert all(picks[i] == 1 for i in probes)        # a probe drafts one token, not the "best" long draft
    assert [b - a for a, b in zip(probes, probes[1:])] == [8, 16, 32] and probes[0] == 3


def test_plain_streak_weighs_the_rates_every_recheck_steps():
    # during a plain streak only t(1) moves: the full evaluation runs every `recheck` steps, not every step
    p = DraftLengthPolicy(7, cost=CostCurve({1: 1.0, 2: 1.6, 4: 2.4, 8: 4.3}, t_draft=0.4), probe_every=1 << 30,
                          recheck=8)
    _feed(p, 0)
    calls = []
    weigh = p._weigh
    p._weigh = lambda: calls.append(1) or weigh()
    assert [p.choose() for _ in range(32)] == [0] * 32
    assert len(calls) == 4
    # speculation starts paying (say the machine got a fast verify): noticed within `recheck` steps
    p.cost = CostCurve({1: 1.0, 8: 1.0}, t_draft=0.0)
    assert 0 < next(i for i in range(1, 20) if p.choose() > 0) <= 8


def test_probes_still_come_between_rechecks():
    p = DraftLengthPolicy(7, cost=CostCurve({1: 1.0, 2: 1.6, 4: 2.4, 8: 4.3}, t_draft=0.4), probe_every=5,
                          recheck=8)
    _feed(p, 0)
    choices = [p.choose() for _ in range(5 + 10 + 20)]
    assert [i for i, c in enumerate(choices) if c] == [4, 14, 34] and set(choices) == {0, 1}


def test_a_new_generation_starts_from_what_the_last_one_learned():
    cost = CostCurve({1: 1.0, 2: 1.1, 4: 1.3, 8: 2.0}, t_draft=0.1)
    fresh = DraftLengthPolicy(7, cost=cost)
    assert fresh.choose() > 0                       # the 0.6 prior: drafting looks worth it
    p = DraftLengthPolicy(7, cost=cost)
    _feed(p, 0)
    p.reset()
    assert p.choose() == 0                          # drafts kept failing: the next generation starts plain
    np.testing.assert_allclose(p.slots.alpha(), p.slots.prior_accept)
    _feed(p, 7)
    p.reset()
    assert p.choose() > 0 and p.slots.alpha()[0] > 0.85   # the failures before weigh 8 observations (carry_weight)


def test_trim_keeps_the_slots_whose_confidence_pays_for_their_rows():
    """E(k) / (t_draft + t(k+1)) with E(k) = 1 + Σ_{j≤k} Π_{i≤j} c_i, written out for a steep CPU-like curve."""
    cost = CostCurve({1: 1.0, 2: 1.2, 4: 1.6, 8: 3.0}, t_draft=0.2)
    p = DraftLengthPolicy(7, cost=cost)
    conf = np.array([0.9, 0.8, 0.2, 0.9, 0.9, 0.9, 0.9])
    rates = []
    for k in range(8):
        e = 1 + sum(np.prod(conf[:j]) for j in range(1, k + 1))
        rates.append(e / (0.2 + cost.verify(k + 1)))
    assert p.trim(conf) == int(np.argmax(rates)) == 2
    assert p.trim(np.full(7, 0.99)) == 7                     # confident throughout: verify them all
    assert p.trim(np.full(7, 0.01)) == 0                     # no slot worth a row: a plain verify
    p.use_confidence = False
    assert p.trim(conf) == 7
    assert DraftLengthPolicy(7, adaptive=False).trim(conf) == 7   # no cost curve: nothing to weigh


def test_one_stalled_step_moves_an_estimate_by_a_clipped_share():
    p = DraftLengthPolicy(7, cost=CostCurve({1: 1.0, 2: 1.2, 8: 2.4}, t_draft=0.1))
    p.observe(0, 0, verify_s=4.0)                       # a plain step that stalled 4x
    assert p.cost.t[1] == pytest.approx(0.9 + 0.1 * 1.25)
    t8 = p.cost.t[8]
    assert t8 == pytest.approx(2.4 * p.cost.t[1])       # every price moved with t(1)
    p.cost.observe_verify(8, 0.1)                       # and one that ran impossibly fast
    share = 0.9 + 0.1 / 1.25                            # t(1) implied lower by the clipped share, every price
    assert p.cost.t[8] == pytest.approx(share * share * t8)     # with it, then t(8) itself by the clipped share
    for _ in range(200):                                # a lasting change of speed still comes through
        p.observe(0, 0, verify_s=2.0)
    assert p.cost.t[1] == pytest.approx(2.0, rel=1e-3)


def test_the_calibrated_shape_only_lowers_t1():
    cost = CostCurve({1: 1.0, 2: 1.2, 8: 2.4}, t_draft=0.1)
    cost.observe_verify(2, 3.6)                         # a slow 2-row verify says nothing about plain steps
    assert cost.t[1] == 1.0
    cost.t[1] = 2.0                                     # t(1) stale from a slow spell
    for _ in range(100):
        cost.observe_verify(2, 1.2)                     # while 2-row verifies take their calibrated time
    assert cost.t[1] == pytest.approx(1.0, rel=1e-3)


def test_a_stale_t1_does_not_keep_a_losing_speculative_streak_going():
    """Replays a measured case (bench, one thread, SmolLM2 Q4_1): the last math prompt left t(1) at 10.14 ms
    against a calibrated 6.93, and the next prompt, an MT-Bench one, drafted on 103 of its 104 steps at slot-1
    acceptance 0.22, 8-17 % slower than plain. t(2)/t(1) 1.18 and the draft costs are that run's."""
    cal = {1: 6.93e-3, 2: 8.16e-3, 3: 9.95e-3, 4: 11.15e-3, 6: 14.27e-3, 8: 17.6e-3}
    counts = []
    for seed in range(5):
        cost = CostCurve(dict(cal), 1.63e-3, short_blocks=True,
                         t_draft_n={1: 0.64e-3, 2: 0.78e-3, 3: 0.88e-3, 4: 1.02e-3, 6: 1.34e-3, 7: 1.63e-3})
        p = DraftLengthPolicy(7, cost=cost)
        p.slots = SlotAcceptance(7, np.array([0.641, 0.6, 0.531, 0.632, 0.6, 0.6, 0.6]), 4.0, 0.98)
        cost.rescale(10.14e-3)          # the slow spell moves every price with t(1) (the run's t(2) was 9.54 ms
                                        # when t(1) alone moved with it)
        rng = np.random.default_rng(seed)
        drafted = 0
        for _ in range(104):
            n = p.choose()
            if n:
                drafted += 1
                accepted = 0
                while accepted < n and rng.random() < 0.22:
                    accepted += 1
                p.observe(n, accepted, verify_s=8.73e-3 + (n - 1) * 1.5e-3, draft_s=1.3e-3)
            else:
                p.observe(0, 0, verify_s=7.5e-3)
        counts.append(drafted)
        assert p.choose() == 0 or p.last_reason == "probe"
    assert max(counts) < 40, counts                      # before: 104 of 104 for every seed


def _play(policy: DraftLengthPolicy, alpha1: float, alpha_rest: float, tokens: int, seed: int) -> tuple[int, int, float]:
    """Runs the policy over a text where slot 1 is accepted with probability alpha1 and each later slot, once the
    ones before it were, with alpha_rest; prices from its own cost curve (draft steps: draft + cold verify).
    Returns (target calls, drafted calls, seconds)."""
    rng = np.random.default_rng(seed)
    calls = drafted = 0
    seconds, done = 0.0, 0
    while done < tokens:
        n = policy.choose()
        calls += 1
        if n == 0:
            policy.observe(0, 0, verify_s=policy.cost.t[1])
            seconds += policy.cost.t[1]
            done += 1
            continue
        drafted += 1
        accepted = 0
        while accepted < n and rng.random() < (alpha1 if accepted == 0 else alpha_rest):
            accepted += 1
        policy.observe(n, accepted)
        seconds += policy.cost.verify(n + 1, cold=True) + policy.cost.draft(n)
        done += accepted + 1
    return calls, drafted, seconds


CPU_LIKE = {1: 1.0, 2: 1.14, 3: 1.32, 4: 1.49, 8: 2.2}       # SmolLM2 Q4_K_M in the loop, 2 threads, cold verifies


def test_a_drafter_that_pays_is_tried_again_after_a_generation_where_it_did_not():
    # The last generation's drafts mostly failed (α1 0.2: plain wins), this one's text suits the drafter (α1 0.6,
    # where drafting pays ~1.2x). Weighed on the mean, the carried estimate kept most steps plain and the probes
    # (after 16, 32, 64 plain steps) could not lift it: in 4 of these 10 texts 2 % of the calls drafted, 37 % on
    # average (explore=False, recheck=32, carry_weight=4). Drawn: 45-83 %, 69 % on average.
    fractions = []
    for seed in range(10):
        policy = DraftLengthPolicy(7, cost=CostCurve(dict(CPU_LIKE), t_draft=0.16, t_cold=dict(CPU_LIKE)))
        for i in range(60):
            policy.observe(1, int(i % 5 == 0))
        policy.reset()
        calls, drafted, _ = _play(policy, 0.6, 0.5, 128, seed)
        fractions.append(drafted / calls)
    assert min(fractions) > 0.3 and np.mean(fractions) > 0.6, fractions


def test_a_drafter_that_never_pays_costs_little_to_keep_trying():
    # α1 0.1 on a steep curve: drafting one token yields 1.1 tokens for 1.3 t(1). The draws still try it now and
    # then; the price of that is bounded.
    cost = CostCurve(dict(CPU_LIKE), t_draft=0.16, t_cold=dict(CPU_LIKE))
    for seed in range(3):
        policy = DraftLengthPolicy(7, cost=cost)
        calls, drafted, seconds = _play(policy, 0.1, 0.3, 400, seed)
        assert drafted < 0.1 * calls
        assert seconds < 1.03 * 400 * cost.t[1]


def test_the_draws_follow_the_evidence():
    # near the break-even the draws try the drafter on some steps and not others; far from it, on almost all or none
    cost = CostCurve(dict(CPU_LIKE), t_draft=0.16, t_cold=dict(CPU_LIKE))

    def share_drafting(accepted: int, of: int) -> float:
        policy = DraftLengthPolicy(7, cost=cost, probe_every=1 << 30)
        for i in range(120):
            policy.observe(1, int(i % of < accepted))
        picks = [policy.choose() for _ in range(400)]
        return sum(n > 0 for n in picks) / len(picks)

    assert share_drafting(0, 4) == 0.0
    assert 0.2 < share_drafting(1, 3) < 0.8          # α1 1/3: one-token drafts cost 1.30 t(1) for 1.33 tokens
    assert share_drafting(4, 4) == 1.0
    mean_only = DraftLengthPolicy(7, cost=cost, probe_every=1 << 30, explore=False)
    for i in range(120):
        mean_only.observe(1, int(i % 3 < 1))
    assert len({mean_only.choose() for _ in range(50)}) == 1
