"""Reusing the held sequence (engine/prefix.py): a generation that continues a cached prefix gives exactly what a
cold start gives (greedy, and T>0 with the same seed), after a cut-short generation too; snapshots restore both
target and drafter; a hybrid target reuses its whole sequence or nothing. Our CPU build reuses a whole conversation
(one attention order for every width); most tests here run the wide/narrow bookkeeping that width-dependent
attention needs (helpers.engine.width_dependent)."""

import pytest

from dflash_gguf.engine.sampling import SamplingParams
from dflash_gguf.engine.prefix import WIDEN_ROWS
from dflash_gguf.engine.target import WIDE_ROWS
from dflash_gguf.settings import EngineSettings
from helpers.engine import (assert_same_bits, next_step_logits, tiny_speculative_engine, width_dependent,
                            write_random_drafter)

GREEDY = SamplingParams(temperature=0.0)
HOT = SamplingParams(temperature=0.8, top_k=20, seed=3)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = width_dependent(tiny_speculative_engine(tmp_path_factory.mktemp("prefix")))
    eng.spec.debug_check_positions = True          # target and drafter hold the same positions after every step
    yield eng
    eng.close()


def cold(engine, prompt, n, sampling=GREEDY, speculative=True):
    engine.forget()
    return engine.generate(prompt, n, sampling, speculative=speculative).tokens


def warm(engine, prompt, n, sampling=GREEDY, speculative=True):
    k = engine.keep_prefix(prompt, speculative=speculative)
    res = engine.generate(prompt, n, sampling, n_cached=k, speculative=speculative)
    assert res.n_cached == k
    return k, res.tokens


def prompt_of(*ids):
    return [1] + [3 + (i % 28) for i in ids]


@pytest.fixture(scope="module")
def one_order_engine(tmp_path_factory):
    eng = tiny_speculative_engine(tmp_path_factory.mktemp("one-order"))
    eng.spec.debug_check_positions = True
    yield eng
    eng.close()


def test_one_order_attention_reuses_a_whole_conversation_with_nothing_re_decoded(one_order_engine):
    """Our CPU build computes each attention row in one order for any ubatch width (patches/0012), so the positions a
    generation decoded in verify batches are what a prefill computes: the next turn reuses every one of them, nothing
    is re-decoded (a follow-up sent at once waits for nothing), target and drafter hold a cold start's bits and greedy
    output is a cold start's. Broken variant caught: the old dispatch (ggml's tiled kernel for >= 64 rows, row by row
    below) with the engine trusting it — the answer's positions then differ from a 200-row prefill's."""
    engine = one_order_engine
    assert engine.target.width_invariant
    first = prompt_of(*range(150))
    engine.forget()
    answer = engine.generate(first, 24, GREEDY).tokens
    assert engine.widen() == 0
    second = first + answer + prompt_of(7, 9, 11)[1:]
    k = engine.keep_prefix(second)
    assert k == len(first) + len(answer) - 1                           # all but the newest token, never decoded
    warm_bits = next_step_logits(engine, second, k)
    engine.forget()
    cold_bits = next_step_logits(engine, second, 0)
    assert_same_bits(warm_bits, cold_bits)
    expected = cold(engine, second, 24)
    engine.forget()
    engine.generate(first, 24, GREEDY)
    assert warm(engine, second, 24) == (len(first) + len(answer) - 1, expected)


# T > 0: the plain decoder draws one random number per token from the target's distribution, so the same seed
# gives the same tokens exactly when the reused prefix leaves the target's distributions as a cold start has them.
# With a drafter the draws also depend on the drafts; verification keeps the target's distribution whatever the
# drafter proposes (tests/test_verify.py), so that path needs no check of its own here.
@pytest.mark.parametrize("sampling,speculative", [(GREEDY, True), (GREEDY, False), (HOT, False)],
                         ids=["greedy", "greedy-plain", "T0.8-seeded-plain"])
def test_next_turn_reuses_the_conversation_and_matches_a_cold_start(engine, sampling, speculative):
    first = prompt_of(*range(150))
    answer = cold(engine, first, 24, sampling, speculative)
    second = first + answer + prompt_of(7, 9, 11)[1:]
    expected = cold(engine, second, 24, sampling, speculative)
    engine.forget()
    engine.generate(first, 24, sampling, speculative=speculative)       # the held sequence of turn 1 again
    assert engine.widen() > 0                                           # what the server does once it answered
    k, tokens = warm(engine, second, 24, sampling, speculative)
    assert k == len(second) - WIDE_ROWS and tokens == expected          # one wide ubatch is decoded again


def test_narrow_positions_are_not_reused_where_a_prefill_decodes_them_wide(engine):
    first = prompt_of(*range(150))
    engine.forget()
    answer = engine.generate(first, 24, GREEDY).tokens
    assert not any(engine.target.wide[len(first):])                     # generated in verify batches
    second = first + answer + [4, 5, 6]
    k, tokens = warm(engine, second, 24)
    assert k <= len(first) and tokens == cold(engine, second, 24)


def test_a_widen_that_yields_to_a_request_leaves_a_sequence_that_continues_exactly(engine):
    """The server's re-decode stops between ubatches once a request waits (prefix.widen's should_stop), cut back to
    what it re-decoded; the follow-up prefills the rest: its last logits are a cold prefill's bits and its greedy
    answer a cold start's. Broken variant caught: the positions after the stop kept as if re-decoded (they were
    computed over the narrow versions of the earlier ones)."""
    import numpy as np
    first = prompt_of(*range(60))
    engine.forget()
    answer = engine.generate(first, 3 * WIDEN_ROWS, GREEDY).tokens
    follow = first + answer + prompt_of(7, 9)[1:]
    assert len(answer) > 2 * WIDEN_ROWS

    def generated_then_interrupted():
        engine.forget()
        engine.generate(first, 3 * WIDEN_ROWS, GREEDY)
        asked = []
        assert engine.widen(lambda: asked.append(1) or len(asked) > 1) == WIDEN_ROWS   # a request after 1 ubatch
        assert len(engine.held_tokens) == WIDEN_ROWS and all(engine.target.wide)

    generated_then_interrupted()
    k = engine.keep_prefix(follow)
    assert k == WIDEN_ROWS
    warm_logits = engine.target.prefill(follow[k:], None)
    engine.forget()
    assert np.array_equal(warm_logits, engine.target.prefill(follow, None))
    expected = cold(engine, follow, 24)
    generated_then_interrupted()
    assert warm(engine, follow, 24) == (WIDEN_ROWS, expected)
    engine.forget()
    engine.generate(first, 8, GREEDY)
    assert engine.widen(lambda: True) == 0 and not all(engine.target.wide)   # a request already waits: untouched


def test_a_shorter_common_prefix_is_cut_back(engine):
    base = prompt_of(*range(200))
    engine.forget()
    engine.generate(base, 16, GREEDY)
    engine.widen()
    edited = base[:150] + prompt_of(5, 5, 5)[1:]         # an edited message: only the first 150 tokens stay
    k, tokens = warm(engine, edited, 16)
    assert k == len(edited) - WIDE_ROWS
    assert tokens == cold(engine, edited, 16)


def test_the_same_prompt_again_decodes_its_last_token(engine):
    p = prompt_of(*range(20))
    expected = cold(engine, p, 12)
    k, tokens = warm(engine, p, 12)
    assert k == len(p) - 1 and tokens == expected


def test_a_generation_cut_short_leaves_a_reusable_cache(engine):
    p = prompt_of(*range(30))
    engine.forget()
    seen = []
    engine.generate(p, 200, GREEDY, lambda new: seen.extend(new) or len(seen) < 10)   # the client leaves
    follow = p + seen + prompt_of(2, 4)[1:]
    k, tokens = warm(engine, follow, 16)
    assert k > len(p) and tokens == cold(engine, follow, 16)


def test_snapshot_restores_target_and_drafter(engine):
    a = prompt_of(*range(120))
    engine.forget()
    answer = engine.generate(a, 20, GREEDY).tokens
    engine.widen()
    snap = engine.snapshot()
    assert snap.tokens == engine.held_tokens and snap.drafter is not None
    cold(engine, prompt_of(*range(100, 140)), 20)        # another conversation takes the contexts
    engine.restore(snap)
    follow = a + answer + prompt_of(1, 2, 3)[1:]
    k, tokens = warm(engine, follow, 20)
    assert k == len(follow) - WIDE_ROWS and tokens == cold(engine, follow, 20)


@pytest.mark.parametrize("how", ["held", "snapshot"])
def test_a_reused_prefix_holds_what_a_cold_prefill_computes_in_target_and_drafter(engine, how):
    """Greedy output does not depend on what the drafter's cache holds, so this compares contents: the target's
    logits and the drafter's block logits after a reuse equal a cold start's, bit for bit. Fails when the drafter's
    KV is not restored from the snapshot (prefix.restore leaves the other conversation's in it: same positions,
    other contents, greedy tokens unchanged), or not cut back to the kept prefix."""
    first = prompt_of(*range(150))
    engine.forget()
    answer = engine.generate(first, 24, GREEDY).tokens
    engine.widen()
    if how == "snapshot":
        snap = engine.snapshot()
        cold(engine, prompt_of(*range(100, 300)), 20)   # longer than the first: its positions cover the prefix
        engine.restore(snap)
    second = first + answer + prompt_of(7, 9, 11)[1:]
    k = engine.keep_prefix(second)
    assert k == len(second) - WIDE_ROWS
    warm_bits = next_step_logits(engine, second, k)
    engine.forget()
    assert_same_bits(warm_bits, next_step_logits(engine, second, 0))


def test_plain_decoding_leaves_the_drafter_behind_so_nothing_is_reused(engine):
    p = prompt_of(*range(25))
    engine.forget()
    engine.generate(p, 8, GREEDY, speculative=False)
    assert engine.keep_prefix(p + [5, 6]) == 0


def test_token_probs_reread_the_target_and_keep_the_cache_consistent(engine):
    p = prompt_of(*range(30))
    engine.forget()
    res = engine.generate(p, 12, GREEDY)
    probs = engine.token_probs(len(p), res.tokens, 3)
    assert [x.token for x in probs] == res.tokens
    assert all(x.top[0][0] == x.token and x.logprob == x.top[0][1] <= 0 for x in probs)   # greedy: the argmax
    assert engine.held_tokens == p + res.tokens[:-1]
    follow = p + res.tokens + [7]
    k, tokens = warm(engine, follow, 10)
    assert k == len(p) + len(res.tokens) - 1 and tokens == cold(engine, follow, 10)


def test_hybrid_target_reuses_its_whole_sequence_only(tmp_path):
    from dflash_gguf.engine.session import Engine
    from helpers.engine import tiny_hybrid_qwen35
    pytest.importorskip("transformers")
    target = tiny_hybrid_qwen35()
    drafter = write_random_drafter(target, tmp_path / "d.gguf", taps=[1, 3], block_size=8, n_head=4, n_head_kv=2,
                                   head_dim=16, n_ff=64)
    eng = Engine(EngineSettings(target=target, drafter=drafter, n_ctx=256, n_threads=1, adaptive=False, draft_max=3))
    try:
        p = [1] + list(range(300, 340))
        answer = cold(eng, p, 12)
        follow = p + answer + [400, 401]
        expected = cold(eng, follow, 12)
        eng.forget()
        eng.generate(p, 12, GREEDY)
        n_held = len(eng.held_tokens)
        k, tokens = warm(eng, follow, 12)
        assert k == n_held >= len(p) and tokens == expected
        assert eng.keep_prefix(p[:20] + [500]) == 0                # a shorter prefix: recurrent state cannot
    finally:
        eng.close()


def test_embedded_default_reuses_bit_exactly():
    """SmolLM2-135M Q4_1 (the embedded default): the last logits of a reused prefix + prefilled rest are the bits of a
    cold prefill, after a generation whose tokens were decoded narrow and then widened (engine/prefix.py)."""
    import numpy as np

    from dflash_gguf.engine.session import Engine
    eng = Engine(EngineSettings(n_ctx=1024, n_threads=1, n_batch=256))
    try:
        m = eng.target_model
        prompt = m.tokenize("Write a short story about a lighthouse keeper and a storm. " * 12)
        answer = eng.generate(prompt, 80, GREEDY).tokens
        eng.widen()
        follow = prompt + answer + m.tokenize(" Now tell it again, shorter.", add_special=False)
        k = eng.keep_prefix(follow)
        assert len(follow) - WIDE_ROWS - 256 <= k < len(follow)
        warm_logits = eng.target.prefill(follow[k:], None)
        eng.forget()
        cold_logits = eng.target.prefill(follow, None)
        assert np.array_equal(warm_logits, cold_logits)
        eng.forget()
        expected = eng.generate(follow, 24, GREEDY).tokens
        eng.forget()
        eng.generate(prompt, 80, GREEDY)
        eng.widen()
        res = eng.generate(follow, 24, GREEDY, n_cached=eng.keep_prefix(follow))
        assert res.n_cached == k and res.tokens == expected
    finally:
        eng.close()
