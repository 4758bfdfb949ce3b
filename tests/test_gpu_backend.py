"""The device path on any GPU backend (CUDA, Vulkan, Metal): layer taps, greedy losslessness, T>0 sampling and
KV rollback with the target on the device.

Marked `gpu`: skipped without a GPU build that sees a device (with DFLASH_GGUF_REQUIRE_GPU=1, as
tools/gpu/check.sh and the Vulkan child of tests/test_vulkan.py set, that is a failure instead). Tolerances:
- taps: per tap, ||device - CPU|| / ||CPU|| <= 1e-3 on F32 weights and <= 5e-2 on Q4_1 (both backends quantize
  the activations to 8 bits for Q4_1 matmuls, but round and sum in another order; on the CPU alone, batch vs
  single-row kernels differ by 7.5e-3 at SmolLM2's last layer), while rows of other positions differ by ~1;
- greedy: F32 identical token for token; F16 identical except where the target itself is at a near-tie
  (logit gap < 0.02, batch and single-row matmuls round differently), at most 2 such prompts;
- T>0: chi-square against the exact distribution computed from the GPU target's own logits (p > 0.01);
- rollback: logits after keep() equal a fresh context's within 1e-4 (F32).
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_gguf.engine.sources.dflash import DFlashSource
from dflash_gguf.engine.loop import SpecDecoder
from dflash_gguf.engine.policy import DraftLengthPolicy
from dflash_gguf.engine.sampling import SamplingParams
from dflash_gguf.engine.target import Target
from dflash_gguf.native.wrappers import Batch, Context, ContextSettings, Model
from helpers.engine import (OracleDrafter, exact_second_token_marginal, pooled_counts, write_random_drafter,
                            stop_with_tokens, write_tiny_llama)
from helpers.gpu import ALL_LAYERS, SETTINGS

pytestmark = pytest.mark.gpu


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _taps(model: Model, tokens: list[int], taps: list[int]) -> np.ndarray:
    """[n_tokens, n_taps, n_embd] of one prefill; 16 rows stay below llama.cpp's batch size for offloading
    CPU-resident weights to the GPU, so -ngl 0 really computes on the CPU."""
    ctx = Context(model, ContextSettings(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2, flash_attn="off"))
    ctx.set_taps(taps)
    batch = Batch(model.native, 64)
    batch.set_tokens(tokens, 0, "all")
    ctx.decode(batch)
    feats = ctx.get_taps(0, len(tokens)).reshape(len(tokens), len(taps), model.n_embd)
    batch.close()
    ctx.close()
    return feats


@pytest.mark.parametrize("precision,tol", [("f32", 1e-3), ("q4_1", 5e-2)])
def test_taps_on_device_equal_cpu_taps(tmp_path, precision, tol):
    # random weights (the GPU check runs these before SmolLM2 has arrived on the machine)
    path = write_tiny_llama(tmp_path / "tiny.gguf", n_embd=256, n_layer=4, n_vocab=512, n_ff=512)
    if precision != "f32":
        from dflash_gguf.native.quantize import llama_quantize
        path = llama_quantize(path, tmp_path / f"tiny-{precision}.gguf", precision)
    tokens = list(range(3, 19))
    cpu, gpu = Model(path, n_gpu_layers=0), Model(path, n_gpu_layers=ALL_LAYERS)
    taps = [0, 1, cpu.n_layer // 2, cpu.n_layer]
    want, got = _taps(cpu, tokens, taps), _taps(gpu, tokens, taps)
    for k, tap in enumerate(taps):
        err = _rel(got[:, k], want[:, k])
        assert err <= tol, f"{precision} tap {tap}: ||device - CPU|| / ||CPU|| = {err:.2e} > {tol}"
        assert _rel(got[1:, k], want[:-1, k]) > 10 * tol      # a row mix-up would show
    cpu.close()
    gpu.close()


def _prompts(n_vocab: int, n: int) -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [[1] + rng.integers(3, n_vocab, size=rng.integers(2, 40)).tolist() for _ in range(n)]


def _generate(decoder: SpecDecoder, prompt, n, sampling=SamplingParams()):
    return decoder.generate(prompt, n, sampling, stop_tokens=lambda t: False)


def _divergence(target: Target, prompt: list[int], ref: list[int], got: list[int], dtype: str) -> int:
    """0 when got == ref; 1 for an F16 near-tie divergence; fails otherwise."""
    if got == ref:
        return 0
    k = next(j for j, (a, b) in enumerate(zip(got, ref)) if a != b)
    target.reset()
    logits = target.prefill(prompt + ref[:k], None)
    gap = abs(float(logits[ref[k]]) - float(logits[got[k]]))
    assert dtype == "f16" and gap < 0.02, f"diverged from plain decoding at token {k} (logit gap {gap:.4f}, {dtype})"
    return 1


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_greedy_speculative_equals_plain_on_device(tmp_path, dtype):
    path = write_tiny_llama(tmp_path / f"tiny-{dtype}.gguf", dtype=np.float32 if dtype == "f32" else np.float16)
    target = Target(Model(path, n_gpu_layers=ALL_LAYERS), SETTINGS, taps=[1, 2], max_verify=8)
    plain = SpecDecoder(target, None, DraftLengthPolicy(1, adaptive=False))
    near_ties, accepted, rejected = 0, 0, 0
    # 6 prompts of 48 tokens: ~10 verify steps each, every one with accepted and rejected slots to roll back
    for i, prompt in enumerate(_prompts(target.model.n_vocab, 6)):
        ref = _generate(plain, prompt, 48).tokens
        oracle = OracleDrafter(prompt + ref, target.model.n_vocab, corrupt=0.3, seed=i, taps=[1, 2])
        spec = SpecDecoder(target, oracle, DraftLengthPolicy(7, adaptive=False))
        spec.debug_check_positions = True          # target and drafter positions agree after every step
        res = _generate(spec, prompt, 48)
        accepted += res.n_accepted
        rejected += res.n_drafted - res.n_accepted
        near_ties += _divergence(target, prompt, ref, res.tokens, dtype)
    # a DFlash drafter on the GPU too: features injected from the GPU target, rollback on both
    draft = write_random_drafter(path, tmp_path / "draft.gguf", taps=[1, 2], block_size=8, n_head=4, n_head_kv=2,
                                 head_dim=16, n_ff=64, seed=3)
    drafter = DFlashSource(Model(draft, n_gpu_layers=ALL_LAYERS), target.ctx, SETTINGS, target.model)
    spec = SpecDecoder(target, drafter, DraftLengthPolicy(7, adaptive=False))
    spec.debug_check_positions = True
    for prompt in _prompts(target.model.n_vocab, 2):
        ref = _generate(plain, prompt, 48).tokens
        near_ties += _divergence(target, prompt, ref, _generate(spec, prompt, 48).tokens, dtype)
    assert near_ties <= 2 and accepted > 0 and rejected > 0
    drafter.close()
    target.close()


def _chi_square_pvalue(counts: np.ndarray, expected: np.ndarray) -> float:
    """p-value of Pearson's chi-square; outcomes expected < 5 times are pooled. scipy where installed, else
    torch (the GPU machine has torch, not necessarily scipy): chi2.sf(x, k) = Q(k/2, x/2)."""
    obs, exp = pooled_counts(counts, expected)
    stat, dof = float(((obs - exp) ** 2 / exp).sum()), len(obs) - 1
    try:
        from scipy import stats
        return float(stats.chi2.sf(stat, dof))
    except ImportError:
        import torch
        return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                             torch.tensor(stat / 2, dtype=torch.float64)))


def test_rejection_sampling_distribution_on_device(tmp_path):
    path = write_tiny_llama(tmp_path / "tiny.gguf", n_vocab=16, seed=5, logit_scale=1.5)
    target = Target(Model(path, n_gpu_layers=ALL_LAYERS), SETTINGS, taps=[1], max_verify=4)
    sampling = SamplingParams(temperature=1.0, top_k=12)
    prompt = [1, 4, 9, 6]
    expected = exact_second_token_marginal(target, prompt, sampling)     # from the GPU target's own logits
    counts = np.zeros_like(expected)
    for seed in range(1200):
        oracle = OracleDrafter([0] * 8 + list(range(3, 16)), 16, corrupt=0.3, seed=seed, boost=2.0, noise=0.5)
        spec = SpecDecoder(target, oracle, DraftLengthPolicy(3, adaptive=False), t_mode="rejection")
        # emissions: the prefill's token, then the first verify step's (3 drafted slots), which draws tokens[1];
        # stop there: later steps cannot change it
        res = spec.generate(prompt, 5, SamplingParams(1.0, 12, seed=seed), stop_tokens=lambda t: False,
                            on_tokens=stop_with_tokens(2))
        assert res.n_drafted > 0
        counts[res.tokens[1]] += 1
    assert _chi_square_pvalue(counts, expected) > 0.01
    # the test has power: half-way to a shifted distribution is rejected
    assert _chi_square_pvalue(counts, 0.5 * expected + 0.5 * np.roll(expected, 1)) < 0.01
    target.close()


def test_kv_rollback_on_device_equals_fresh_context(tmp_path):
    """Logits after keep() equal a fresh context's that decoded the same kept rows. A device may round a row
    differently in batches of other sizes, so the tolerance is that noise, measured: the same prefix decoded
    in one batch vs in two (never below 1e-4 of the logits' scale); a missed rollback differs 10x more."""
    path = write_tiny_llama(tmp_path / "tiny.gguf", n_layer=3, n_vocab=64)
    model = Model(path, n_gpu_layers=ALL_LAYERS)
    prompt, verify, probe = [1, 5, 9, 12, 7, 30], [11, 22, 33, 44, 55, 6, 17, 28], [40]

    def logits_after(*batches) -> np.ndarray:
        t = Target(model, SETTINGS, max_verify=8)
        t.prefill(batches[0], None)
        for b in batches[1:]:
            t.decode_rows(b)
        out = np.array(t.decode_rows(probe)[0])
        t.close()
        return out

    rolled = Target(model, SETTINGS, max_verify=8)
    rolled.prefill(prompt, None)
    rolled.decode_rows(verify)
    rolled.keep(3, len(verify))                              # 5 rejected rows leave the KV cache
    after = np.array(rolled.decode_rows(probe)[0])
    rolled.close()
    want = logits_after(prompt, verify[:3])
    noise = np.abs(logits_after(prompt + verify[:3]) - want).max()
    tol = max(2 * noise, 1e-4 * np.abs(want).max())
    np.testing.assert_allclose(after, want, rtol=0, atol=tol)
    stale = logits_after(prompt, verify)                     # what a missed rollback would have produced
    assert np.abs(stale - want).max() > 10 * tol
