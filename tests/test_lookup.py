"""Prompt lookup: the longest earlier match of the text's suffix, its continuation (periodic where the text
repeats), a point-mass q at T > 0; the policy's per-match-length acceptance and its choice between sources."""

import numpy as np

from dflash_gguf.engine.cost import CostCurve
from dflash_gguf.engine.policy import DraftLengthPolicy, LookupAcceptance
from dflash_gguf.engine.sources.lookup import LookupSource


def _source(text, max_ngram=4):
    s = LookupSource(n_vocab=50, block_size=8, max_ngram=max_ngram)
    s.begin()
    s.see(text)
    return s


def test_longest_match_wins_and_its_latest_occurrence():
    # suffix [3, 4]: occurs at 0..1 (then 5) and at 6..7 (then 9); the 1-gram [4] also after 2 (then 7)
    s = _source([3, 4, 5, 2, 4, 7, 3, 4, 9, 1, 3, 4])
    assert s.match(3) == ([9, 1, 3], 2)
    # a suffix seen nowhere before: no draft
    assert _source([1, 2, 3, 4]).match(5) == ([], 0)


def test_continuation_repeats_where_the_text_loops():
    s = _source([7, 1, 2, 3, 1, 2, 3, 1, 2])
    tokens, m = s.match(7)
    assert m == 4 and tokens == [3, 1, 2, 3, 1, 2, 3]


def test_match_follows_the_text_as_it_grows():
    s = _source([5, 6, 7, 8])
    assert s.match(2) == ([], 0)
    s.see([5, 6])
    assert s.match(2) == ([7, 8], 2)


def test_draft_is_a_point_mass_at_t_above_zero():
    s = _source([4, 5, 6, 4, 5])
    p = s.draft(5, 4, 3, want_logits=True)
    assert p.tokens == [6, 4, 5]
    np.testing.assert_array_equal(p.q.argmax(axis=1), p.tokens)
    assert p.q.shape == (3, 50) and (p.q.sum(axis=1) == 1).all() and p.q.max() == 1.0
    assert s.draft(5, 4, 3, want_logits=False).q is None


def test_lookup_acceptance_is_tracked_per_match_length():
    acc = LookupAcceptance(n_slots=3, max_match=4, prior_accept=0.5, prior_weight=1.0, decay=1.0)
    for _ in range(20):
        acc.record(4, 3, 3)          # long matches: the whole continuation agreed
        acc.record(1, 3, 0)          # one-token matches: the first slot disagreed
    assert acc.alpha(4)[0] > 0.95 and acc.alpha(1)[0] < 0.05
    assert acc.alpha(1)[1:] == [0.5, 0.5]          # never reached: still the prior
    assert acc.expected(6) == acc.expected(4)       # longer matches share the top bucket
    e = acc.expected(4)
    a = acc.alpha(4)
    assert np.isclose(e[2], 1 + a[0] + a[0] * a[1])
    acc.record(2, 3, 1)
    assert acc.expected(2, 1) == acc.expected(2)[:2]     # only as far as asked, the same values


def _policy(has_drafter, **kw):
    cost = CostCurve({1: 1.0, 2: 1.1, 4: 1.3, 8: 2.0}, t_draft=0.3, t_cold={2: 1.5, 4: 1.8, 8: 2.6})
    p = DraftLengthPolicy(7, cost=cost, **kw)
    p.use_lookup(4)
    p.has_drafter = has_drafter
    return p


def test_policy_takes_the_lookup_where_it_pays_and_plain_where_it_does_not():
    p = _policy(has_drafter=False)
    for _ in range(50):
        p.observe_lookup(4, [1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 7, 8])
        p.observe_lookup(1, [1, 2, 3], [9])
    kind, k = p.choose_step(4, 7)
    assert kind == "lookup" and k >= 4
    assert p.choose_step(1, 3) == ("plain", 0)
    assert p.choose_step(0, 0) == ("plain", 0)


def test_policy_weighs_the_lookup_against_the_drafter():
    p = _policy(has_drafter=True)
    for _ in range(200):
        p.observe(7, 7)              # the drafter: every slot accepted, so it drafts long
        p.observe_lookup(2, [1, 2], [1, 5])    # two-token matches: slot 2 always wrong
    kind, n = p.choose_step(2, 2)
    assert kind == "draft" and n == 7            # 8 tokens in 2.9 beat the lookup's 2 in 1.1
    for _ in range(200):
        p.observe_lookup(3, list(range(7)), list(range(8)))
    assert p.choose_step(3, 7) == ("lookup", 7)  # 8 tokens in 2.0 (warm, no draft call) beat 8 in 2.9


def test_drafts_are_priced_with_the_verify_after_a_draft():
    cost = CostCurve({1: 1.0, 2: 1.1}, t_draft=0.2, t_cold={2: 1.6})
    assert cost.verify(2) == 1.1 and cost.verify(2, cold=True) == 1.6
    cost.observe_verify(2, 1.7, cold=True)
    assert cost.t[2] == 1.1 and cost.t_cold[2] > 1.6
    assert CostCurve.from_json(cost.to_json()).t_cold == cost.t_cold


def test_an_offer_is_checked_against_the_text_that_follows_it():
    """A continuation longer than a step's emitted tokens keeps being checked by the steps after it: its far slots
    get evidence (else they keep the prior and are never tried), each offer counted once."""
    p = DraftLengthPolicy(7, cost=CostCurve({1: 1.0, 32: 1.5}, t_draft=0.3), lookup_max=24)
    p.use_lookup(4)
    text = list(range(100, 124))
    p.observe_lookup(4, text, text[:3])           # a step emitting 3 tokens: 21 slots still unknown
    assert p.lookup.tried[4][3] == 0
    p.observe_lookup(0, None, text[3:10])         # no new offer: the old one goes on
    p.observe_lookup(0, None, text[10:20] + [7])  # slot 20 disagrees
    tried, accepted = p.lookup.tried[4], p.lookup.accepted[4]
    assert tried[:21] == [1.0] * 21 and tried[21:] == [0.0] * 3
    assert accepted[:20] == [1.0] * 20 and accepted[20] == 0.0
    p.observe_lookup(0, None, [1, 2, 3])          # resolved: nothing more is recorded
    assert p.lookup.tried[4] == tried


def test_a_repeating_text_is_verified_past_the_drafters_block():
    """Where the continuation keeps agreeing and a long verify costs little more than a short one, the lookup
    takes more tokens than the drafter's block; with the same evidence and draft_max as the cap, it stops there."""
    cost = CostCurve({1: 1.0, 2: 1.1, 8: 1.6, 16: 2.0, 32: 2.8}, t_draft=0.3)
    long, capped = (DraftLengthPolicy(7, cost=cost, lookup_max=m) for m in (31, None))
    for p in (long, capped):
        p.use_lookup(4)
        p.has_drafter = False
        for _ in range(30):
            p.observe_lookup(4, list(range(40)), list(range(40)))
    kind, k = long.choose_step(4, 40)
    assert kind == "lookup" and k >= 16
    assert capped.choose_step(4, 40) == ("lookup", 7)


def test_lookup_verifies_stay_at_the_block_on_recurrent_targets(tmp_path):
    """A recurrent target keeps one state snapshot per verified row: there the lookup stops at the block, while an
    attention-only target verifies up to --lookup-max (and the context holds room for that many rows)."""
    from dflash_gguf.engine.session import Engine
    from dflash_gguf.settings import EngineSettings
    from helpers.engine import tiny_hybrid_qwen35, write_tiny_llama
    for path, recurrent in ((write_tiny_llama(tmp_path / "tiny.gguf"), False), (tiny_hybrid_qwen35(), True)):
        engine = Engine(EngineSettings(target=path, draft_source="lookup", n_ctx=256, n_threads=1), calibrate=False)
        try:
            assert engine.spec.policy.lookup_max == engine.lookup_max
            if recurrent:
                assert engine.lookup_max == engine.draft_max < 32
                assert engine.target.ctx.n_rs_seq() == engine.draft_max + 1
            else:
                assert engine.lookup_max == 32 and engine.target._max_rows == 34
        finally:
            engine.close()
