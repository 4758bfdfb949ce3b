"""DFlash2 and DSpark draft sources on the real embedded target (SmolLM2-135M-Instruct Q4_1): greedy output
equals plain greedy decoding token for token, and T > 0 output is distributed like plain sampling, in
both --t-modes, with the proposal distribution the selector walk / Markov chain actually samples from."""

from __future__ import annotations

import numpy as np
import pytest

from dflash_gguf.engine.dflash2 import DFlash2Drafter
from dflash_gguf.engine.draft_sources import open_drafter
from dflash_gguf.engine.dspark import DSparkDrafter
from dflash_gguf.engine.loop import SpecDecoder
from dflash_gguf.engine.policy import DraftLengthPolicy
from dflash_gguf.engine.sampling import SamplingParams
from dflash_gguf.engine.target import Target
from dflash_gguf.native.wrappers import ContextSettings, Model
from engine_helpers import assert_same_distribution, exact_second_token_marginal, project_prompts
from family_helpers import shipped_family_drafter

pytest.importorskip("torch")
SETTINGS = ContextSettings(n_ctx=1024, n_batch=256, n_ubatch=256, n_threads=2)
KINDS = {"dflash2": ("DFlash2", False, DFlash2Drafter), "dspark": ("DSpark", False, DSparkDrafter),
         "dspark-anchor-first": ("DSpark", True, DSparkDrafter)}


def _never_stop(_token: int) -> bool:
    return False


@pytest.fixture(scope="module")
def smollm2():
    from dflash_gguf.targets import smollm2 as path
    return path("q4_1")


@pytest.fixture(scope="module")
def drafters(smollm2, tmp_path_factory):
    d = tmp_path_factory.mktemp("family-engine")
    return {kind: shipped_family_drafter(member, smollm2, d / f"{kind}.gguf", sample_from_anchor=anchor)
            for kind, (member, anchor, _) in KINDS.items()}


@pytest.fixture(scope="module")
def target(smollm2):
    model = Model(smollm2)
    t = Target(model, SETTINGS, taps=[2, 11, 19, 28], max_verify=8)
    yield t
    t.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
def test_greedy_equals_plain_on_smollm2(target, drafters, kind):
    member, _, cls = KINDS[kind]
    drafter = open_drafter(Model(drafters[kind]), target.ctx, SETTINGS, target.model)
    assert type(drafter) is cls
    plain = SpecDecoder(target, None, DraftLengthPolicy(1, adaptive=False))
    spec = SpecDecoder(target, drafter, DraftLengthPolicy(7, adaptive=False))
    spec.debug_check_positions = True
    accepted = drafted = calls = generated = 0
    for i, text in enumerate(project_prompts(per_category=2)):
        prompt = target.model.tokenize(text, add_special=False)
        ref = plain.generate(prompt, 48, stop_tokens=_never_stop).tokens
        res = spec.generate(prompt, 48, stop_tokens=_never_stop)
        if res.tokens != ref:
            k = next(j for j, (a, b) in enumerate(zip(res.tokens, ref)) if a != b)
            pytest.fail(f"{kind}, prompt {i}: speculative output diverged from plain at token {k}")
        accepted, drafted = accepted + res.n_accepted, drafted + res.n_drafted
        calls, generated = calls + res.n_target_calls, generated + len(res.tokens) - 1
    assert drafted > accepted
    if kind != "dspark-anchor-first":      # the shipped backbone was trained DFlash-style (rows 1..n)
        assert accepted > 0, f"{kind}: no draft token accepted"
    print(f"{kind}: tau {generated / calls:.3f}, accepted {accepted}/{drafted}")


@pytest.mark.slow
@pytest.mark.parametrize("kind,t_mode", [("dflash2", "rejection"), ("dflash2", "match"),
                                         ("dspark", "rejection"), ("dspark", "match")])
def test_sampling_distribution_equals_plain_on_smollm2(target, drafters, kind, t_mode):
    """The second generated token (drafted and verified speculatively) follows the exact marginal."""
    drafter = open_drafter(Model(drafters[kind]), target.ctx, SETTINGS, target.model)
    sampling = SamplingParams(temperature=1.0, top_k=8)
    prompt = target.model.tokenize("The capital of France is", add_special=False)
    expected = exact_second_token_marginal(target, prompt, sampling)
    spec = SpecDecoder(target, drafter, DraftLengthPolicy(3, adaptive=False), t_mode=t_mode)
    counts = np.zeros_like(expected)
    n_accepted = 0
    for seed in range(800):
        # 5 tokens: the loop drafts at most max_tokens - len(tokens) - 1, so 2 would leave a plain step
        res = spec.generate(prompt, 5, SamplingParams(1.0, 8, seed=seed), stop_tokens=_never_stop)
        assert res.n_drafted > 0
        n_accepted += res.n_accepted
        counts[res.tokens[1]] += 1
    assert n_accepted > 0                       # the accept path ran, not only rejections
    assert_same_distribution(counts, expected)


@pytest.mark.parametrize("kind", ["dflash2", "dspark"])
def test_engine_decodes_t_above_zero_in_match_mode_with_family_drafters(smollm2, drafters, kind, capsys):
    from dflash_gguf.engine.session import Engine
    from dflash_gguf.settings import EngineSettings
    settings = EngineSettings(target=smollm2, drafter=drafters[kind], n_ctx=512, n_threads=2, adaptive=False)
    engine = Engine(settings)
    assert settings.t_mode == "rejection" and engine.spec.t_mode == "match"
    assert f"{KINDS[kind][0]} drafter uses --t-mode match" in capsys.readouterr().err
    engine.close()
