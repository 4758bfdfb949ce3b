"""MoE expert offload through llama.cpp's buffer-type overrides: tensors land where asked, output unchanged."""

import re

import pytest

from dflash_gguf.engine.loop import SpecDecoder
from dflash_gguf.engine.policy import DraftLengthPolicy
from dflash_gguf.engine.target import Target
from dflash_gguf.native.lib import capture_log
from dflash_gguf.native.offload import OffloadError, moe_overrides, parse_override
from dflash_gguf.native.wrappers import ContextSettings, Model, TensorOverride
from helpers.engine import write_tiny_llama

SETTINGS = ContextSettings(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2)


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("moe") / "tiny-moe.gguf", arch="qwen3moe", n_layer=3, seed=11)


def _greedy(model: Model, prompt, n=24) -> list[int]:
    target = Target(model, SETTINGS)
    try:
        return SpecDecoder(target, None, DraftLengthPolicy(1, adaptive=False)).generate(
            prompt, n, stop_tokens=lambda t: False).tokens
    finally:
        target.close()


def _overridden(lines: list[str]) -> set[str]:
    return {m.group(1) for line in lines if (m := re.search(r"tensor (\S+) .*buffer type overridden to (\S+)", line))}


@pytest.mark.parametrize("n_cpu_moe,cpu_moe,expected_layers", [(1, False, {0}), (2, False, {0, 1}), (0, True, {0, 1, 2})])
def test_moe_rules_place_exactly_the_expert_tensors(tiny_moe, n_cpu_moe, cpu_moe, expected_layers):
    rules = [TensorOverride(*parse_override(s)) for s in moe_overrides(n_cpu_moe, cpu_moe)]
    with capture_log() as lines:
        model = Model(tiny_moe, overrides=rules)
    placed = _overridden(lines)
    want = {f"blk.{i}.ffn_{k}_exps.weight" for i in expected_layers for k in ("gate", "up", "down")}
    assert placed == want
    prompt = [1, 7, 3, 9, 12]
    assert _greedy(model, prompt) == _greedy(Model(tiny_moe), prompt)


def test_unknown_buffer_type_is_a_clear_error(tiny_moe):
    with pytest.raises(OffloadError, match="unknown buffer type 'CUDA7'.*this build has: CPU"):
        Model(tiny_moe, overrides=[TensorOverride(r"ffn_.*_exps", "CUDA7")])
    with pytest.raises(OffloadError, match="REGEX=BUFFER_TYPE"):
        parse_override("no-equals-sign")
