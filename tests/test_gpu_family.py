"""DFlash2 and DSpark drafters on a device (any GPU backend; lavapipe in CI): the selector walk and the Markov
chain computed in the drafter's graph on the device, the real SmolLM2 target on the CPU (bit-exact, fast).
Greedy output equals plain decoding token for token, and τ is within noise of the same drafter on the CPU
(where DSpark's chain runs in numpy: the device's in-graph chain must accept like it). Marked `gpu` like
tests/test_gpu_engine.py."""

from __future__ import annotations

import pytest

from dflash_gguf.engine.sources.dflash2 import DFlash2Source
from dflash_gguf.engine.sources import open_drafter
from dflash_gguf.engine.sources.dspark import DSparkSource
from dflash_gguf.engine.loop import SpecDecoder
from dflash_gguf.engine.policy import DraftLengthPolicy
from dflash_gguf.engine.target import Target
from dflash_gguf.native.lib import capture_log
from dflash_gguf.native.wrappers import ContextSettings, Model
from helpers.engine import project_prompts
from helpers.family import shipped_family_drafter
from helpers.gpu import ALL_LAYERS

pytestmark = pytest.mark.gpu
SETTINGS = ContextSettings(n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=2)
MEMBERS = {"DFlash2": DFlash2Source, "DSpark": DSparkSource}


@pytest.fixture(scope="module")
def smollm2():
    from dflash_gguf.packaged_models import smollm2_q4_1
    return smollm2_q4_1()


@pytest.fixture(scope="module")
def target(smollm2):
    model = Model(smollm2, devices=("none",))
    t = Target(model, SETTINGS, taps=[2, 11, 19, 28], max_verify=8)
    yield t
    t.close()
    model.close()


def _never_stop(_token: int) -> bool:
    return False


@pytest.mark.parametrize("member", list(MEMBERS))
def test_family_drafter_on_the_device_equals_plain_and_accepts_like_the_cpu(smollm2, target, member, tmp_path):
    path = shipped_family_drafter(member, smollm2, tmp_path / f"{member}.gguf", outtype="q8_0")
    plain = SpecDecoder(target, None, DraftLengthPolicy(1, adaptive=False))
    prompts = [target.model.tokenize(text, add_special=False) for text in project_prompts(per_category=1)]
    refs = [plain.generate(p, 32, stop_tokens=_never_stop).tokens for p in prompts]
    tau = {}
    for where, ngl in (("cpu", 0), ("device", ALL_LAYERS)):
        with capture_log() as lines:
            tau[where] = _tau_equal_to_plain(target, path, member, where, ngl, prompts, refs)
        # llama.cpp warns when a decode outgrew the compute buffer reserved at start-up (freed and allocated again in
        # the middle of generating): DSpark's in-graph chain needs its block reserved too (patches/0018)
        grown = [line for line in lines if "does not match expectation" in line]
        assert not grown, f"{member} on the {where}: " + "".join(grown)
    print(f"{member}: τ CPU {tau['cpu']:.3f}, device {tau['device']:.3f}")
    assert abs(tau["device"] - tau["cpu"]) <= 0.1 * tau["cpu"], tau


def _tau_equal_to_plain(target, path, member, where, ngl, prompts, refs) -> float:
    """The drafter's τ over the prompts, each output checked against plain decoding's."""
    draft_model = Model(path, n_gpu_layers=ngl)
    drafter = open_drafter(draft_model, target.ctx, SETTINGS, target.model)
    assert type(drafter) is MEMBERS[member]
    if member == "DSpark":      # offloaded: the chain runs in the device's graph; on the CPU in numpy
        assert (drafter.markov is None) == (where == "device")
    spec = SpecDecoder(target, drafter, DraftLengthPolicy(7, adaptive=False))
    emitted = calls = accepted = 0
    for i, (prompt, ref) in enumerate(zip(prompts, refs)):
        res = spec.generate(prompt, 32, stop_tokens=_never_stop)
        assert res.tokens == ref, f"{member} drafter on the {where}, prompt {i}: output differs from plain"
        emitted, calls = emitted + len(res.tokens) - 1, calls + res.n_target_calls
        accepted += res.n_accepted
    assert accepted > 0, f"{member} on the {where}: no draft token accepted"
    drafter.close()
    draft_model.close()
    return emitted / calls
