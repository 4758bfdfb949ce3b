"""The engine on a device (any GPU backend: CUDA, Vulkan, Metal): placements, the adaptive policy's calibration,
recurrent rollback, MoE expert placement, --fit, graph splits, and τ against the CPU.

Marked `gpu` like tests/test_gpu_backend.py (skipped without a device; a failure with DFLASH_GGUF_REQUIRE_GPU=1).
Greedy equality is asserted against plain decoding *on the same placement*: a device's one-row and many-row
kernels may round differently from the CPU's, so outputs are compared within one backend, near-ties allowed
only as in test_gpu_backend (F16 weights). Tiny random models keep this fast on a software device (lavapipe).
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from dflash_gguf.engine.sources.dflash import DFlashSource
from dflash_gguf.engine.loop import SpecDecoder
from dflash_gguf.engine.policy import DraftLengthPolicy
from dflash_gguf.engine.session import Engine
from dflash_gguf.engine.target import Target
from dflash_gguf.native.lib import capture_log
from dflash_gguf.native.offload import gpu_free_bytes, moe_overrides, parse_override
from dflash_gguf.native.wrappers import ContextSettings, Model, TensorOverride
from dflash_gguf.settings import EngineSettings
from helpers.engine import OracleDrafter, assert_rollback_keeps_output, write_random_drafter, write_tiny_llama
from helpers.gpu import ALL_LAYERS, NEAR_TIE, SETTINGS, near_tie_gap

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(target, drafter): a 3-layer F32 llama and a random DFlash drafter tapping it."""
    d = tmp_path_factory.mktemp("tiny")
    target = write_tiny_llama(d / "tiny.gguf", n_layer=3, n_vocab=64, seed=2)
    drafter = write_random_drafter(target, d / "draft.gguf", taps=[1, 2], block_size=8, n_head=4, n_head_kv=2,
                                   head_dim=16, n_ff=64, seed=3)
    return target, drafter


def _prompts(n_vocab: int, n: int, seed: int = 7) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[1] + rng.integers(3, n_vocab, size=rng.integers(2, 30)).tolist() for _ in range(n)]


def _greedy(decoder: SpecDecoder, prompt, n):
    return decoder.generate(prompt, n, stop_tokens=lambda t: False)


def _device_description() -> str:
    from dflash_gguf.native.lib import load
    g = load().ggml
    devs = [g.ggml_backend_dev_get(i) for i in range(g.ggml_backend_dev_count())]
    return " ".join(g.ggml_backend_dev_description(d).decode() for d in devs if g.ggml_backend_dev_type(d) != 0)


def _device_name() -> str:
    from dflash_gguf.native.lib import load
    from dflash_gguf.native.offload import device_names
    return next(n for n in device_names(load()) if n != "CPU")


@pytest.mark.parametrize("n_gpu_layers,drafter_on", [(ALL_LAYERS, "device"), (ALL_LAYERS, "cpu"), (2, "device"),
                                                     (1, "cpu")])
def test_greedy_equals_plain_for_every_placement(tiny, n_gpu_layers, drafter_on):
    """Full and partial offload of the target, the drafter on the device or on the CPU: features read back from
    the device, injected into the drafter's KV cache, rollback on both."""
    target_path, drafter_path = tiny
    target = Target(Model(target_path, n_gpu_layers=n_gpu_layers), SETTINGS, taps=[1, 2], max_verify=8)
    plain = SpecDecoder(target, None, DraftLengthPolicy(1, adaptive=False))
    # the drafter's layers on the CPU (-ngld 0); it still reads the target's output head where that lives
    draft_model = Model(drafter_path, n_gpu_layers=ALL_LAYERS if drafter_on == "device" else 0)
    drafter = DFlashSource(draft_model, target.ctx, SETTINGS, target.model)
    accepted = rejected = ties = 0
    # 3 prompts of 32 tokens: ~6 verify steps per prompt and source, with accepted and rejected slots
    for i, prompt in enumerate(_prompts(target.model.n_vocab, 3)):
        ref = _greedy(plain, prompt, 32).tokens
        for source in (OracleDrafter(prompt + ref, target.model.n_vocab, corrupt=0.3, seed=i, taps=[1, 2]), drafter):
            spec = SpecDecoder(target, source, DraftLengthPolicy(7, adaptive=False))
            spec.debug_check_positions = True
            res = _greedy(spec, prompt, 32)
            gap = near_tie_gap(target, prompt, ref, res.tokens)
            assert gap is None or gap < NEAR_TIE, (f"prompt {i}: {type(source).__name__} on {drafter_on}, "
                                                   f"-ngl {n_gpu_layers}: diverged with logit gap {gap}")
            ties += gap is not None
            accepted += res.n_accepted
            rejected += res.n_drafted - res.n_accepted
    assert accepted > 0 and rejected > 0 and ties <= 2
    drafter.close()
    draft_model.close()
    target.close()


def test_engine_on_device_equals_plain(tiny):
    """The whole engine with -ngl 99, adaptive: the verify-cost calibration runs on the device first (the
    batches 8, 1, 2, 3, ... that crashed lavapipe in ggml-vulkan's fused mat-vec + add: patches/0008), then
    draft lengths vary. (A fixed draft length is the same engine path minus both; the placement test above
    runs fixed lengths on the device.) Equal up to a near-tie, as the placement test: on an H200 (2026-12-04) the
    outputs parted at token 16 of one prompt, where CUDA's kernels for one row and for a batch round apart."""
    target_path, drafter_path = tiny
    engine = Engine(EngineSettings(target=target_path, drafter=drafter_path, n_ctx=512, n_gpu_layers=ALL_LAYERS,
                                   adaptive=True, n_threads=2))
    try:
        assert engine.cost is not None
        ties = 0
        for i, prompt in enumerate(_prompts(engine.target_model.n_vocab, 3, seed=11)):
            spec = engine.generate(prompt, 40, speculative=True)
            plain = engine.generate(prompt, 40, speculative=False)
            gap = near_tie_gap(engine.target, prompt, plain.tokens, spec.tokens)
            assert gap is None or gap < NEAR_TIE, f"prompt {i}: diverged with logit gap {gap}"
            ties += gap is not None
        assert ties <= 1
    finally:
        engine.close()


@pytest.mark.parametrize("mode", ["snapshots", "checkpoint"])
def test_recurrent_rollback_on_device(mode):
    """A gated delta-net hybrid target on the device: recurrent state rolled back by per-token snapshots or by
    checkpoint + replay reproduces plain greedy decoding."""
    from helpers.engine import tiny_hybrid_qwen35
    target = Target(Model(tiny_hybrid_qwen35(), n_gpu_layers=ALL_LAYERS), SETTINGS, taps=[1, 3], max_verify=8,
                    force_checkpoint=mode == "checkpoint")
    assert target.recurrent and target.rollback_mode.kind == mode
    assert_rollback_keeps_output(target, n_prompts=2, n_tokens=24, label=f"rollback ({mode}) on the device")
    target.close()


def _buffer_sizes(lines: list[str]) -> dict[str, float]:
    """'load_tensors: Vulkan0 model buffer size = 1.23 MiB' → {"Vulkan0": 1.23, "CPU_Mapped": ...}."""
    return {m.group(1): float(m.group(2)) for line in lines
            if (m := re.search(r"(\S+) model buffer size\s*=\s*([\d.]+) MiB", line))}


@pytest.mark.parametrize("n_cpu_moe,cpu_moe,expected_layers", [(1, False, {0}), (0, True, {0, 1, 2})])
def test_moe_experts_stay_on_the_host(tmp_path, n_cpu_moe, cpu_moe, expected_layers):
    path = write_tiny_llama(tmp_path / "tiny-moe.gguf", arch="qwen3moe", n_layer=3, seed=11)
    rules = [TensorOverride(*parse_override(s)) for s in moe_overrides(n_cpu_moe, cpu_moe)]
    with capture_log() as lines:
        model = Model(path, n_gpu_layers=ALL_LAYERS, overrides=rules)
    placed = {m.group(1): m.group(2) for line in lines
              if (m := re.search(r"tensor (\S+) .*buffer type overridden to (\S+)", line))}
    want = {f"blk.{i}.ffn_{k}_exps.weight" for i in expected_layers for k in ("gate", "up", "down")}
    # host memory: the CPU buffer type, or the device's pinned host buffer type (Vulkan_Host, CUDA_Host)
    assert set(placed) == want and all(b == "CPU" or b.endswith("_Host") for b in placed.values()), placed
    sizes = _buffer_sizes(lines)
    assert sizes.get(_device_name(), 0) > 0 and any(k.startswith("CPU") and v > 0 for k, v in sizes.items())
    target = Target(model, SETTINGS, taps=[1, 2], max_verify=8)
    plain = SpecDecoder(target, None, DraftLengthPolicy(1, adaptive=False))
    if "llvmpipe" in _device_description():
        # lavapipe (Mesa 22.3) segfaults in its worker threads on this MoE graph during speculative verify
        # batches (cause not found; dense targets pass every placement): check placement + plain decoding
        assert len(_greedy(plain, [1, 5, 9, 13], 16).tokens) == 16
        target.close()
        model.close()
        pytest.xfail("MoE speculative verify crashes lavapipe: placement and plain decoding checked only")
    for i, prompt in enumerate(_prompts(model.n_vocab, 3)):
        ref = _greedy(plain, prompt, 24).tokens
        spec = SpecDecoder(target, OracleDrafter(prompt + ref, model.n_vocab, corrupt=0.3, seed=i, taps=[1, 2]),
                           DraftLengthPolicy(7, adaptive=False))
        assert _greedy(spec, prompt, 24).tokens == ref
    target.close()
    model.close()


def test_fit_chooses_layers_from_the_devices_memory(tmp_path, capsys):
    """--fit with --fit-target set so that about half of the target's layers fit in what the device reports free."""
    from dflash_gguf.engine.fit import plan_fit, read_sizes
    from dflash_gguf.native.lib import load
    path = write_tiny_llama(tmp_path / "wide.gguf", n_layer=6, n_embd=256, n_ff=1024, n_vocab=64, seed=4)
    free = gpu_free_bytes(load())[0]
    sizes = read_sizes(path, 512)
    layer = max(sizes.layer_bytes) + sizes.kv_bytes_per_token // sizes.n_layer * 512
    compute = 512 << 20                                          # plan_fit's compute reserve
    margin_mib = (free - compute - int(3.5 * layer)) >> 20       # leaves room for 3 of the 6 layers
    assert margin_mib > 0
    expected = plan_fit(sizes, None, 512, None, free, margin_bytes=margin_mib << 20)
    assert 0 < expected.n_gpu_layers < sizes.n_layer
    with capture_log() as lines:
        engine = Engine(EngineSettings(target=path, n_ctx=512, fit=True, fit_target=margin_mib, n_threads=2),
                        speculative=False)
    try:
        assert engine.settings.n_gpu_layers == expected.n_gpu_layers
        offloaded = [m for line in lines if (m := re.search(r"offloaded (\d+)/(\d+) layers to GPU", line))]
        assert offloaded and int(offloaded[-1].group(1)) == expected.n_gpu_layers
        prompt = [1, 5, 9, 13]
        assert engine.generate(prompt, 16, speculative=False).tokens  # it runs where --fit put it
    finally:
        engine.close()
    assert "fit:" in capsys.readouterr().err


def _splits_and_cpu_ops(lines: list[str]) -> tuple[int, list[str]]:
    """From GGML_SCHED_DEBUG=2 output: the number of splits of the last graph and the ops computed on the CPU."""
    text = "".join(lines)
    graphs = text.split("## SPLIT #0:")
    last = "## SPLIT #0:" + graphs[-1] if len(graphs) > 1 else text
    splits = len(re.findall(r"## SPLIT #\d+:", last))
    cpu_ops = sorted({m.group(1) for m in re.finditer(r"node #\s*\d+ \(\s*(\S+)\):\s+\S+ \([^)]*\) \[\s*CPU ", last)})
    return splits, cpu_ops


def test_graph_splits_and_cpu_fallbacks(tiny, record_property):
    """The scheduler's splits for the target's verify graph and the drafter's block graph, all layers on the
    device, and every op that ran on the CPU instead (ggml falls back silently where a backend lacks an op)."""
    target_path, drafter_path = tiny
    os.environ["GGML_SCHED_DEBUG"] = "2"        # read whenever a context (re)creates its scheduler
    try:
        target = Target(Model(target_path, n_gpu_layers=ALL_LAYERS), SETTINGS, taps=[1, 2], max_verify=8)
        drafter = DFlashSource(Model(drafter_path, n_gpu_layers=ALL_LAYERS), target.ctx, SETTINGS, target.model)
        drafter.begin()
        target.prefill([1, 5, 9, 13], drafter.process)
        with capture_log() as draft_log:
            drafter.draft(17, target.n_past, 7, want_logits=False)
        with capture_log() as verify_log:
            target.decode_rows([17, 3, 4, 5])
    finally:
        del os.environ["GGML_SCHED_DEBUG"]
    t_splits, t_cpu = _splits_and_cpu_ops(verify_log)
    d_splits, d_cpu = _splits_and_cpu_ops(draft_log)
    report = f"target verify graph: {t_splits} splits, CPU ops {t_cpu}; drafter block graph: {d_splits} splits, CPU ops {d_cpu}"
    print(report)
    record_property("graph_splits", report)
    # measured on lavapipe (Vulkan) and expected of any complete backend: the token embedding lookup reads
    # the CPU-resident embedding table (llama.cpp keeps it on the host) and everything else runs on the device
    assert t_cpu == ["GET_ROWS"] and t_splits == 2, report
    assert set(d_cpu) <= {"GET_ROWS"} and d_splits <= 2, report
    drafter.close()
    target.close()


TAU_PROMPTS = ["def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
               "The three laws of thermodynamics are"]


def test_tau_with_the_drafter_on_the_device_matches_the_cpu():
    """llama.cpp #25792: DFlash acceptance collapsing on a backend is a wrong drafter graph, not a slow one. The
    real SmolLM2 target (on the CPU: bit-exact and fast) with the shipped drafter on the device vs on the CPU:
    greedy output identical to plain, and τ within noise of the CPU's on the same prompts."""
    from dflash_gguf.assets import shipped_drafter_for
    from dflash_gguf.packaged_models import smollm2_q4_1
    target_path = smollm2_q4_1()
    settings = ContextSettings(n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=2)
    target_model = Model(target_path, devices=("none",))
    target = Target(target_model, settings, taps=[], max_verify=8)
    plain = SpecDecoder(target, None, DraftLengthPolicy(1, adaptive=False))
    prompts = [target_model.tokenize(p, add_special=True) for p in TAU_PROMPTS]
    refs = [_greedy(plain, p, 32).tokens for p in prompts]
    tau = {}
    for where, ngl in (("cpu", 0), ("device", ALL_LAYERS)):
        draft_model = Model(shipped_drafter_for(target_path), n_gpu_layers=ngl)
        target.ctx.set_taps(draft_model.target_layer_ids())
        drafter = DFlashSource(draft_model, target.ctx, settings, target_model)
        spec = SpecDecoder(target, drafter, DraftLengthPolicy(7, adaptive=False))
        emitted = calls = 0
        for prompt, ref in zip(prompts, refs):
            res = _greedy(spec, prompt, 32)
            assert res.tokens == ref, f"drafter on the {where}: output differs from plain decoding"
            emitted += len(res.tokens) - 1          # the first token comes from the prefill
            calls += res.n_target_calls
        tau[where] = emitted / calls
        drafter.close()
        draft_model.close()
    print(f"τ with the shipped drafter: CPU {tau['cpu']:.3f}, device {tau['device']:.3f}")
    assert tau["cpu"] > 1.3                                   # the drafter works at all on these prompts
    assert abs(tau["device"] - tau["cpu"]) <= 0.1 * tau["cpu"], tau
    target.close()
    target_model.close()
