"""The speculative loop is lossless: greedy output equals plain greedy token for token, and
T>0 output is distributed exactly like plain sampling. Runs every accept/reject/rollback path."""

import numpy as np
import pytest

from dflash_gguf.engine.sources.dflash import DFlashSource
from dflash_gguf.engine.loop import SpecDecoder
from dflash_gguf.engine.cost import CostCurve
from dflash_gguf.engine.policy import DraftLengthPolicy
from dflash_gguf.engine.sampling import SamplingParams
from dflash_gguf.engine.sources.lookup import LookupSource
from dflash_gguf.engine.target import ContextOverflow, Target
from dflash_gguf.native.wrappers import ContextSettings, Model
from helpers.engine import (OracleDrafter, assert_rollback_keeps_output, assert_same_distribution,
                            exact_second_token_marginal, exact_token_marginal, write_random_drafter,
                            write_tiny_llama)

N_PROMPTS, N_TOKENS = 20, 128
SETTINGS = ContextSettings(n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2)


@pytest.fixture(scope="module", params=["f32", "f16"])
def tiny_target(request, tmp_path_factory):
    dtype = np.float32 if request.param == "f32" else np.float16
    path = write_tiny_llama(tmp_path_factory.mktemp("tiny") / f"tiny-{request.param}.gguf", dtype=dtype)
    model = Model(path)
    target = Target(model, SETTINGS, taps=[1, 2], max_verify=8)
    yield target
    target.close()


def _prompts(n_vocab: int, n: int = N_PROMPTS) -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [[1] + rng.integers(3, n_vocab, size=rng.integers(2, 40)).tolist() for _ in range(n)]


def _never_stop(_token: int) -> bool:
    return False


def _generate(decoder: SpecDecoder, prompt, n=N_TOKENS, sampling=SamplingParams()):
    return decoder.generate(prompt, n, sampling, stop_tokens=_never_stop)


@pytest.mark.parametrize("draft_max,corrupt,adaptive", [(7, 0.25, False), (3, 0.5, False), (7, 0.15, True)])
def test_greedy_speculative_equals_plain_with_oracle(tiny_target, draft_max, corrupt, adaptive):
    plain = SpecDecoder(tiny_target, None, DraftLengthPolicy(1, adaptive=False))
    # a cost curve on which short drafts and plain steps both win sometimes, so the policy switches
    cost = CostCurve({1: 1.0, 2: 1.3, 4: 2.0, 8: 4.0}, t_draft=0.3)
    totals = np.zeros(3)
    for i, prompt in enumerate(_prompts(tiny_target.model.n_vocab)):
        ref = _generate(plain, prompt).tokens
        oracle = OracleDrafter(prompt + ref, tiny_target.model.n_vocab, corrupt=corrupt, seed=i, taps=[1, 2])
        policy = DraftLengthPolicy(draft_max, adaptive=adaptive, cost=cost if adaptive else None)
        spec = SpecDecoder(tiny_target, oracle, policy)
        spec.debug_check_positions = True          # target and drafter positions agree after every step
        res = _generate(spec, prompt)
        assert res.tokens == ref, f"prompt {i}: speculative output diverged"
        assert sum(n for _, n in oracle.injected) == len(prompt) + len(ref) - 1   # every kept row injected once
        totals += [res.n_accepted, res.n_drafted - res.n_accepted, res.n_plain_steps]
    accepted, rejected, plain_steps = totals
    assert accepted > 0 and rejected > 0          # both paths ran
    if adaptive:
        assert plain_steps > 0


@pytest.mark.parametrize("short_blocks,draft_max", [(False, 7), (True, 7), (True, 2)])
def test_greedy_with_dflash_drafter_matches_plain(tiny_target, tmp_path, short_blocks, draft_max):
    draft_path = write_random_drafter(tiny_target.model.path, tmp_path / "draft.gguf", taps=[1, 2], block_size=8,
                                      n_head=4, n_head_kv=2, head_dim=16, n_ff=64, seed=3)
    dm = Model(draft_path)
    drafter = DFlashSource(dm, tiny_target.ctx, SETTINGS, tiny_target.model)
    drafter.short_blocks = short_blocks            # n+1 rows per draft instead of the whole block
    spec = SpecDecoder(tiny_target, drafter, DraftLengthPolicy(draft_max, adaptive=False))
    spec.debug_check_positions = True
    plain = SpecDecoder(tiny_target, None, DraftLengthPolicy(1, adaptive=False))
    accepted = 0
    for prompt in _prompts(tiny_target.model.n_vocab, 6):
        ref = _generate(plain, prompt, 64).tokens
        res = _generate(spec, prompt, 64)
        assert res.tokens == ref
        accepted += res.n_accepted
    assert accepted > 0          # the drafter's accepted rows went through rollback + injection too
    drafter.close()


def test_greedy_equals_plain_when_the_drafters_probabilities_trim_its_blocks(tiny_target, tmp_path):
    """DFlash rates its slots by its own top probabilities, calibrated as it runs, and the adaptive policy
    verifies only those worth their rows: output unchanged, some slots trimmed, the calibration fed."""
    from dflash_gguf.engine.confidence import ConfidenceCalibration
    draft_path = write_random_drafter(tiny_target.model.path, tmp_path / "draft.gguf", taps=[1, 2], block_size=8,
                                      n_head=4, n_head_kv=2, head_dim=16, n_ff=64, seed=3)
    drafter = DFlashSource(Model(draft_path), tiny_target.ctx, SETTINGS, tiny_target.model)
    assert drafter.rates_by_probability and drafter.rate_slots()
    # a CPU-like verify cost and frequent probes, so that calls keep coming while most of the random drafts fail
    policy = DraftLengthPolicy(7, cost=CostCurve({1: 1.0, 2: 1.1, 8: 2.4}, t_draft=0.05), probe_every=1)
    policy.calibration = ConfidenceCalibration()
    spec = SpecDecoder(tiny_target, drafter, policy)
    spec.debug_check_positions = True
    plain = SpecDecoder(tiny_target, None, DraftLengthPolicy(1, adaptive=False))
    trimmed = verified = 0
    for prompt in _prompts(tiny_target.model.n_vocab, 6):
        res = _generate(spec, prompt, 64)
        assert res.tokens == _generate(plain, prompt, 64).tokens
        trimmed, verified = trimmed + res.n_trimmed, verified + res.n_drafted
    assert trimmed > 0 and verified > 0, (trimmed, verified)
    assert policy.calibration.tried.sum() > 0
    drafter.close()


class _AlwaysDrafter(DraftLengthPolicy):
    """Picks the drafter every step, so that "override" puts the lookup continuation into its blocks."""

    def choose_step(self, match_len, available):
        return "draft", self.draft_max


@pytest.mark.parametrize("source,combine,adaptive", [
    ("lookup", "prefer", False), ("lookup", "prefer", True), ("hybrid", "prefer", False),
    ("hybrid", "prefer", True), ("hybrid", "override", False)])
def test_greedy_with_lookup_and_hybrid_sources_matches_plain(tiny_target, tmp_path, source, combine, adaptive):
    """Lookup drafts alone, or beside the DFlash drafter (per step, or put into its block), give plain greedy's
    tokens; the drafter is fed every kept row while lookup drafts are verified, so it stays in sync."""
    drafter = None
    if source == "hybrid":
        draft_path = write_random_drafter(tiny_target.model.path, tmp_path / "draft.gguf", taps=[1, 2], block_size=8,
                                          n_head=4, n_head_kv=2, head_dim=16, n_ff=64, seed=3)
        drafter = DFlashSource(Model(draft_path), tiny_target.ctx, SETTINGS, tiny_target.model)
    cost = CostCurve({1: 1.0, 2: 1.1, 4: 1.4, 8: 2.2}, t_draft=0.2, t_cold={2: 1.3, 4: 1.6, 8: 2.5})
    policy_class = _AlwaysDrafter if combine == "override" else DraftLengthPolicy
    spec = SpecDecoder(tiny_target, drafter, policy_class(7, adaptive=adaptive, cost=cost if adaptive else None),
                       lookup=LookupSource(tiny_target.model.n_vocab), combine=combine)
    spec.debug_check_positions = True              # target and drafter positions agree after every step
    plain = SpecDecoder(tiny_target, None, DraftLengthPolicy(1, adaptive=False))
    lookup_accepted = lookup_rejected = drafter_slots = 0
    for i, prompt in enumerate(_prompts(tiny_target.model.n_vocab, 8)):
        ref = _generate(plain, prompt, 96).tokens
        res = _generate(spec, prompt, 96)
        assert res.tokens == ref, f"prompt {i}: {source} ({combine}) diverged from plain"
        lookup_accepted += res.n_lookup_accepted
        lookup_rejected += res.n_lookup_drafted - res.n_lookup_accepted
        drafter_slots += res.n_drafted - res.n_lookup_drafted
    assert lookup_accepted > 0 and lookup_rejected > 0       # lookup drafts accepted and rejected
    if drafter is not None:
        assert drafter_slots > 0                             # the drafter drafted too, in sync after lookup steps
        drafter.close()


def test_draft_window_bounds_drafter_kv_and_stays_lossless(tiny_target, tmp_path):
    draft_path = write_random_drafter(tiny_target.model.path, tmp_path / "draft.gguf", taps=[1, 2], block_size=8,
                                      n_head=4, n_head_kv=2, head_dim=16, n_ff=64, seed=4)
    drafter = DFlashSource(Model(draft_path), tiny_target.ctx, SETTINGS, tiny_target.model, window=48)
    spec = SpecDecoder(tiny_target, drafter, DraftLengthPolicy(7, adaptive=False))
    spec.debug_check_positions = True
    plain = SpecDecoder(tiny_target, None, DraftLengthPolicy(1, adaptive=False))
    prompt = _prompts(tiny_target.model.n_vocab, 1)[0] * 3
    assert _generate(spec, prompt, 150).tokens == _generate(plain, prompt, 150).tokens
    held = drafter.pos_max() - drafter.ctx.pos_min() + 1
    assert drafter.pos_max() > 150 and held <= 48 - 8, held
    drafter.close()


def _count_decodes(drafter: DFlashSource) -> list[tuple[str, int]]:
    """Record (what, rows) of every decode the drafter's context runs from now on."""
    calls, decode = [], drafter.ctx.decode
    drafter.ctx.decode = lambda batch, what="decode": (calls.append((what, batch.n_tokens)), decode(batch, what))[1]
    return calls


def test_fallback_steps_neither_draft_nor_inject_row_by_row(tiny_target, tmp_path):
    """A plain step of the speculative loop costs the drafter one row copy: no draft call, and no decode until
    a full ubatch of rows is pending or a draft needs them; the output equals plain decoding."""
    draft_path = write_random_drafter(tiny_target.model.path, tmp_path / "draft.gguf", taps=[1, 2], block_size=8,
                                      n_head=4, n_head_kv=2, head_dim=16, n_ff=64, seed=6)
    drafter = DFlashSource(Model(draft_path), tiny_target.ctx, SETTINGS, tiny_target.model)
    calls = _count_decodes(drafter)
    never = DraftLengthPolicy(7, cost=CostCurve({1: 1.0, 8: 1.0}, t_draft=1e9), probe_every=1 << 30)
    spec = SpecDecoder(tiny_target, drafter, never)
    plain = SpecDecoder(tiny_target, None, DraftLengthPolicy(1, adaptive=False))
    prompt = _prompts(tiny_target.model.n_vocab, 1)[0]
    res = _generate(spec, prompt, 100)
    assert res.tokens == _generate(plain, prompt, 100).tokens
    assert res.n_plain_steps == res.n_target_calls == 99 and res.n_drafted == 0
    n_rows = len(prompt) + 99                      # the prompt and every step's row (the last token is not decoded)
    assert calls == [("feature injection", drafter.n_batch)] * (n_rows // drafter.n_batch)
    assert drafter.pos_max() == n_rows - 1         # a draft (here: the position check) flushes the rest
    assert calls[-1] == ("feature injection", n_rows % drafter.n_batch)
    drafter.close()


def test_a_draft_is_priced_without_a_plain_streaks_backlog_but_with_a_steps_kept_rows(tiny_target, tmp_path):
    """The rows a plain streak held back go in before any draft: a probe's draft time must not carry them (the
    policy then saw ~3x dearer drafts and stayed plain where drafting pays), while the few kept rows each
    speculative step injects are part of what speculating costs. Each injection is slowed by 0.2 s here."""
    import time
    draft_path = write_random_drafter(tiny_target.model.path, tmp_path / "draft.gguf", taps=[1, 2], block_size=8,
                                      n_head=4, n_head_kv=2, head_dim=16, n_ff=64, seed=8)
    drafter = DFlashSource(Model(draft_path), tiny_target.ctx, SETTINGS, tiny_target.model)
    flush = drafter.flush
    drafter.flush = lambda: (time.sleep(0.2) if drafter._n_pending else None, flush())[1]
    prompt = _prompts(tiny_target.model.n_vocab, 1)[0]

    def drafts_seen(policy, n_tokens):
        seen, observe = [], policy.observe
        policy.observe = lambda n, acc, **kw: (seen.append(kw["draft_s"]) if n else None, observe(n, acc, **kw))[1]
        _generate(SpecDecoder(tiny_target, drafter, policy), prompt, n_tokens)
        return seen

    probing = DraftLengthPolicy(7, cost=CostCurve({1: 1.0, 8: 1.0}, t_draft=1e9), probe_every=20)
    probes = drafts_seen(probing, 25)                  # one probe after 19 plain steps: ~20 rows backlog
    # the backlog's flush sleeps 0.2 s: counted, the probe's draft time would be at least that (a bound that holds
    # however loaded the machine is; 0.1 failed once, the draft itself taking 0.104 s beside a compile)
    assert len(probes) == 1 and probes[0] < 0.2, probes
    steady = drafts_seen(DraftLengthPolicy(2, adaptive=False), 12)
    assert len(steady) >= 4 and all(d >= 0.2 for d in steady[1:]), steady   # after the prompt's rows: kept rows
    drafter.close()


def test_buffered_injection_gives_the_drafter_what_row_by_row_injection_gives(tiny_target, tmp_path):
    """Rows injected in one batch when a draft needs them leave the drafter the same K/V as rows injected one
    decode each: bit-identical draft logits (the CPU kernels are batch-invariant)."""
    draft_path = write_random_drafter(tiny_target.model.path, tmp_path / "draft.gguf", taps=[1, 2], block_size=8,
                                      n_head=4, n_head_kv=2, head_dim=16, n_ff=64, seed=7)
    drafter = DFlashSource(Model(draft_path), tiny_target.ctx, SETTINGS, tiny_target.model)
    width = 2 * tiny_target.model.n_embd
    rows = np.random.default_rng(3).standard_normal((150, width)).astype(np.float32)   # [rows, n_taps*n_embd]
    stops = (20, 37, 90, 150)                      # a draft after each; 90 and 150 cross a full ubatch of 64

    def drafts(row_by_row: bool) -> list[np.ndarray]:
        drafter.begin()
        out, done = [], 0
        for stop in stops:
            for i in range(done, stop):
                drafter.process(rows[i:i + 1], i)
                if row_by_row:
                    drafter.flush()
            out.append(drafter.draft(3, stop, 7, want_logits=True).logits)
            done = stop
        return out

    for eager, buffered in zip(drafts(True), drafts(False)):
        np.testing.assert_array_equal(eager, buffered)
    drafter.close()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["snapshots", "checkpoint"])
def test_hybrid_target_rollback_is_lossless(mode):
    """Gated delta-net target: recurrent state rolled back by per-token snapshots (n_rs_seq) or by
    checkpoint + replay; both must reproduce plain greedy decoding."""
    from helpers.engine import tiny_hybrid_qwen35
    target = Target(Model(tiny_hybrid_qwen35()), SETTINGS, taps=[1, 3], max_verify=8,
                    force_checkpoint=mode == "checkpoint")
    assert target.recurrent and target.rollback_mode.kind == mode
    assert target.ctx.n_rs_seq() == (8 if mode == "snapshots" else 0)
    assert_rollback_keeps_output(target, n_prompts=6, n_tokens=64, label=f"hybrid rollback ({mode})")
    target.close()


def test_long_prompt_injects_in_ubatch_chunks(tiny_target, tmp_path):
    """A prefill longer than the drafter's ubatch (64 rows) goes in as several non-causal injections."""
    draft_path = write_random_drafter(tiny_target.model.path, tmp_path / "draft.gguf", taps=[1, 2], block_size=8,
                                      n_head=4, n_head_kv=2, head_dim=16, n_ff=64, seed=5)
    big = ContextSettings(n_ctx=512, n_batch=256, n_ubatch=256, n_threads=2)
    target = Target(tiny_target.model, big, taps=[1, 2], max_verify=8)
    drafter = DFlashSource(Model(draft_path), target.ctx, big, tiny_target.model)
    spec = SpecDecoder(target, drafter, DraftLengthPolicy(7, adaptive=False))
    spec.debug_check_positions = True
    plain = SpecDecoder(target, None, DraftLengthPolicy(1, adaptive=False))
    prompt = (_prompts(tiny_target.model.n_vocab, 1)[0] * 12)[:200]
    assert _generate(spec, prompt, 32).tokens == _generate(plain, prompt, 32).tokens
    drafter.close()
    target.close()


def test_prompt_longer_than_context_is_a_clear_error(tiny_target):
    plain = SpecDecoder(tiny_target, None, DraftLengthPolicy(1, adaptive=False))
    with pytest.raises(ContextOverflow, match="the prompt alone is 601 tokens and the context holds 512 positions"):
        plain.generate([1] + [5] * 600, 8)


def test_generation_stops_at_context_end(tiny_target):
    oracle = OracleDrafter([0] * 2000, tiny_target.model.n_vocab, corrupt=1.0)
    spec = SpecDecoder(tiny_target, oracle, DraftLengthPolicy(7, adaptive=False))
    res = spec.generate([1] + [5] * 500, 100, stop_tokens=_never_stop)
    assert res.finish_reason == "length" and 500 + 1 + len(res.tokens) - 1 <= 512


# ---- T > 0: the output distribution equals plain sampling ------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("t_mode,boost,noise", [
    ("rejection", 0.0, 2.0),     # q: random, far from p
    ("rejection", 2.0, 0.5),     # q: peaked on a guess of the target's continuation
    ("match", 0.0, 2.0),         # one-hot proposals (sample-and-match)
])
def test_sampling_distribution_equals_plain(tmp_path, t_mode, boost, noise):
    path = write_tiny_llama(tmp_path / "tiny.gguf", n_vocab=16, seed=5, logit_scale=1.5)
    target = Target(Model(path), SETTINGS, taps=[1], max_verify=4)
    sampling = SamplingParams(temperature=1.0, top_k=12)
    prompt = [1, 4, 9, 6]
    expected = exact_second_token_marginal(target, prompt, sampling)
    n = 2500
    counts = np.zeros_like(expected)
    for seed in range(n):
        oracle = OracleDrafter([0] * 8 + list(range(3, 16)), 16, corrupt=0.3, seed=seed, boost=boost, noise=noise)
        spec = SpecDecoder(target, oracle, DraftLengthPolicy(3, adaptive=False), t_mode=t_mode)
        res = spec.generate(prompt, 5, SamplingParams(1.0, 12, seed=seed), stop_tokens=_never_stop)
        assert res.n_drafted > 0                     # t1 came out of a speculative verify
        counts[res.tokens[1]] += 1
    assert_same_distribution(counts, expected)
    target.close()


@pytest.mark.slow
@pytest.mark.parametrize("source,combine", [("lookup", "prefer"), ("hybrid", "prefer"), ("hybrid", "override")])
def test_lookup_sampling_distribution_equals_plain(tmp_path, source, combine):
    """A lookup draft is a point mass: verification divides by q = onehot(x) (accept with p(x), else draw from
    norm(max(p − onehot, 0))). The second and third tokens, drafted by the lookup on most runs, are distributed
    exactly as plain sampling's."""
    path = write_tiny_llama(tmp_path / "tiny.gguf", n_vocab=16, seed=5, logit_scale=1.5)
    target = Target(Model(path), SETTINGS, taps=[1], max_verify=4)
    sampling = SamplingParams(temperature=1.0, top_k=12)
    prompt = [1, 4, 9, 6, 3, 7, 4, 9, 2, 8, 10, 11, 12, 5, 13, 14, 15, 3, 6]    # most tokens occur: lookup matches
    expected = [exact_token_marginal(target, prompt, sampling, i) for i in (1, 2)]
    n = 2500
    counts = np.zeros((2, len(expected[0])))
    looked_up = 0
    for seed in range(n):
        oracle = None
        if source == "hybrid":
            oracle = OracleDrafter([0] * 24 + list(range(3, 16)), 16, corrupt=0.3, seed=seed, boost=2.0, noise=0.5)
        policy = (_AlwaysDrafter if combine == "override" else DraftLengthPolicy)(3, adaptive=False)
        spec = SpecDecoder(target, oracle, policy, lookup=LookupSource(16), combine=combine)
        res = spec.generate(prompt, 5, SamplingParams(1.0, 12, seed=seed), stop_tokens=_never_stop)
        looked_up += res.n_lookup_drafted > 0
        counts[0, res.tokens[1]] += 1
        counts[1, res.tokens[2]] += 1
    assert looked_up > n // 2
    for c, e in zip(counts, expected):
        assert_same_distribution(c, e)
    target.close()


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["q4_1", "f16"])
def test_greedy_equality_on_smollm2(precision):
    """Real weights (the embedded SmolLM2-135M-Instruct: Q4_1 with its Q8_0 output head, and an F16 copy),
    21 real prompts x 128 tokens, oracle drafts with every accept/reject pattern: token for token equal
    to plain greedy decoding, no tie allowance (batch-invariant CPU kernels, tests/test_exactness.py)."""
    from dflash_gguf.packaged_models import smollm2
    from helpers.engine import project_prompts
    prompts = project_prompts(per_category=7)
    assert len(prompts) >= N_PROMPTS
    model = Model(smollm2(precision))
    target = Target(model, ContextSettings(n_ctx=1024, n_batch=256, n_ubatch=256, n_threads=2),
                    taps=[1, 15, 28], max_verify=8)
    plain = SpecDecoder(target, None, DraftLengthPolicy(1, adaptive=False))
    for i, text in enumerate(prompts):
        prompt = model.tokenize(text, add_special=False)
        ref = _generate(plain, prompt).tokens
        oracle = OracleDrafter(prompt + ref, model.n_vocab, corrupt=0.25, seed=i)
        spec = SpecDecoder(target, oracle, DraftLengthPolicy(7, adaptive=False))
        spec.debug_check_positions = True
        res = _generate(spec, prompt)
        assert res.n_accepted > 0 and res.n_drafted > res.n_accepted
        if res.tokens != ref:
            k = next(j for j, (a, b) in enumerate(zip(res.tokens, ref)) if a != b)
            pytest.fail(f"{precision}, prompt {i}: speculative output diverged from plain at token {k}")
    target.close()


def frozen_cpu_curve() -> CostCurve:
    """SmolLM2 Q4_K_M's prices on a 2-core Zen 3 (bench runs 117-120: a verify of 2 rows 1.2 t(1) after a draft,
    a 1-token draft 0.15 t(1)), frozen: with smoothing 0 no timing the loop takes moves them (every size the loop
    runs is in the tables), so what the policy decides depends on the drafter and the text alone, not on how busy
    the machine is."""
    t = {1: 6.0e-3, 2: 7.0e-3, 3: 8.3e-3, 4: 9.8e-3, 6: 12.4e-3, 8: 15.0e-3}
    return CostCurve(t, 1.4e-3, smoothing=0.0, short_blocks=True,
                     t_draft_n={1: 0.9e-3, 2: 1.1e-3, 3: 1.2e-3, 4: 1.25e-3, 5: 1.3e-3, 6: 1.35e-3, 7: 1.4e-3},
                     t_cold={2: 7.2e-3, 3: 8.6e-3, 4: 10.0e-3, 5: 11.4e-3, 6: 12.6e-3, 7: 13.8e-3, 8: 15.2e-3})


def test_a_frozen_curve_keeps_its_prices():
    curve = frozen_cpu_curve()
    before = (dict(curve.t), dict(curve.t_cold), dict(curve.t_draft_n))
    for n in range(1, 8):
        curve.observe_verify(n + 1, 1.0, cold=True)        # a slow spell, then a fast one
        curve.observe_verify(n + 1, 1e-6, cold=True)
        curve.observe_draft(1.0, n)
    curve.observe_verify(3, 1e-6)
    curve.rescale(curve.t[1])
    assert (curve.t, curve.t_cold, curve.t_draft_n) == before


@pytest.mark.slow
def test_adaptive_dflash_with_trimmed_blocks_equals_plain_on_smollm2(monkeypatch):
    """The adaptive engine with --draft-trim (DFlash's blocks trimmed by its calibrated probabilities) on the
    embedded SmolLM2 with the shipped drafter: plain greedy's tokens, token for token; without it nothing is
    trimmed. The prices are a frozen CPU curve: calibrated live, a curve timed while the machine was busy made
    every verify look cheap, and nothing was trimmed (a CI run beside other builds)."""
    from dataclasses import replace

    from dflash_gguf.engine.session import Engine
    from dflash_gguf.settings import EngineSettings
    from helpers.engine import project_prompts
    monkeypatch.setattr(Engine, "_cost_curve", lambda self: frozen_cpu_curve())
    settings = EngineSettings(n_ctx=1024, n_threads=2, draft_source="dflash")
    trimmed = {}
    for trim in (True, False):
        engine = Engine(replace(settings, draft_trim=trim))
        try:
            assert engine.policy.use_confidence is trim and (engine.policy.calibration is not None) is trim
            trimmed[trim] = drafted = 0
            for i, text in enumerate(project_prompts(per_category=2)):
                prompt = engine.tokenize(text, add_special=False)
                ref = engine.generate(prompt, 96, speculative=False).tokens
                res = engine.generate(prompt, 96)
                assert res.tokens == ref, f"draft_trim={trim}, prompt {i}: diverged from plain"
                trimmed[trim] += res.n_trimmed
                drafted += res.n_drafted
            assert drafted > 0
        finally:
            engine.close()
    assert trimmed[True] > 0 and trimmed[False] == 0, trimmed


@pytest.mark.slow
def test_every_draft_source_equals_plain_on_smollm2():
    """The embedded SmolLM2 (Q4_1) with the shipped drafter, 12 real prompts x 96 tokens, fixed draft lengths (every
    step drafts where its source can): dflash, lookup and hybrid each give plain greedy's tokens, token for token;
    and a lookup-only engine loads no drafter at all."""
    from dataclasses import replace

    from dflash_gguf.engine.session import Engine
    from dflash_gguf.settings import EngineSettings
    from helpers.engine import project_prompts
    settings = EngineSettings(n_ctx=1024, n_threads=2, adaptive=False)
    engine = Engine(settings)
    lookup_only = Engine(replace(settings, draft_source="lookup"))
    assert lookup_only.drafter is None and lookup_only.spec.lookup is not None
    drafted = dict.fromkeys(("dflash", "lookup", "hybrid"), 0)
    try:
        for i, text in enumerate(project_prompts(per_category=4)):
            prompt = engine.tokenize(text, add_special=False)
            ref = engine.generate(prompt, 96, speculative=False).tokens
            for source in drafted:
                res = engine.generate(prompt, 96, source=source)
                assert res.tokens == ref, f"{source}, prompt {i}: diverged from plain"
                drafted[source] += res.n_accepted
            assert lookup_only.generate(prompt, 96).tokens == ref, f"lookup without a drafter, prompt {i}"
    finally:
        engine.close()
        lookup_only.close()
    assert all(drafted.values()), drafted


def test_lookup_drafts_from_recorded_answers_and_output_stays_plain_on_smollm2():
    """The hybrid source with a corpus of earlier answers (serve --learn's): on prompts whose answers the corpus
    holds, the target accepts tokens drafted from it, and every output equals plain greedy's; on
    prompts it does not hold, output equals plain too. Adaptive policy (the default), so the corpus's matches are
    priced apart from the request's own."""
    from dflash_gguf.engine.session import Engine
    from dflash_gguf.engine.sources.corpus import Corpus
    from dflash_gguf.settings import EngineSettings
    from helpers.engine import project_prompts
    corpus = Corpus()
    engine = Engine(EngineSettings(n_ctx=1024, n_threads=2, draft_source="hybrid"), corpus=corpus)
    lookup = engine.decoder("hybrid").lookup
    assert lookup.corpus is corpus
    prompts = [engine.tokenize(t, add_special=False) for t in project_prompts(per_category=3)]
    try:
        refs = [engine.generate(p, 64, speculative=False).tokens for p in prompts]
        for ref in refs[:5]:
            corpus.add(ref)
        accepted = {False: 0, True: 0}
        for i, (p, ref) in enumerate(zip(prompts, refs)):
            for use in (False, True):
                lookup.corpus = corpus if use else None
                res = engine.generate(p, 64)
                assert res.tokens == ref, f"prompt {i}, corpus {'on' if use else 'off'}: diverged from plain"
                if i < 5:
                    accepted[use] += res.n_corpus_accepted
    finally:
        engine.close()
    assert accepted[False] == 0 and accepted[True] > 20, accepted
