"""Batch invariance of a whole target on the CPU, bit for bit: the logits of row i of a verify batch of B = 2..16
tokens equal those of the same token decoded alone, for the embedded SmolLM2 at each precision (Q4_1 with its Q8_0
output head, F16, BF16, F32, Q4_0, Q5_1, Q4_K_M, IQ4_NL, IQ4_XS), for Gemma 3 270M Q4_K_M and for a tiny random
Qwen3 at Q3_K_M (17 of its matrices Q3_K), at Q2_K, IQ3_S, IQ1_S, IQ1_M, IQ2_XXS and IQ2_XS, a tiny random Qwen3 MoE
at Q4_K_M and Q4_0 (its experts through mul_mat_id); F16 / F32 / Q8_0 KV caches; a short context and one past 512
cells (where ggml's CPU flash attention used to split a single row's KV over threads); at one thread as well, where
our flash attention gives a unit of work all of SmolLM2's 3 K/V heads up to B = 7 and one K/V head from B = 8, so
rows taken both ways are compared; and the same logits at 1, 2 and 3 threads past several of flash attention's
chunks of positions, which the threads split between them where a row's heads are too few to keep them busy. This is
what makes greedy speculative decoding equal plain decoding on every x86 CPU, not only mostly."""

from pathlib import Path

import numpy as np
import pytest

from dflash_gguf.engine.target import Target
from dflash_gguf.native.wrappers import ContextSettings, Model
from helpers.engine import project_prompts

MAX_B = 16


def _tokens(model: Model, n: int) -> list[int]:
    text = "\n\n".join(project_prompts(per_category=40))
    tokens = model.tokenize(text, add_special=False)
    assert len(tokens) >= n
    return tokens[:n]


def _target_file(precision: str):
    from dflash_gguf.packaged_models import gemma3_270m, smollm2
    if precision.startswith("tiny-"):   # SmolLM2's and Gemma 3's rows are not 256 wide: few Q3_K / Q2_K / IQ3_S
        from dflash_gguf.paths import cache_root
        from tools.gpu.random_gguf import make
        shape, ftype = ("tiny-moe", precision.removeprefix("tiny-moe-")) if precision.startswith("tiny-moe-") else \
            ("tiny-dense", precision.removeprefix("tiny-"))
        return Path(make(shape, ftype, cache_root() / "models" / f"{shape}.{ftype.upper()}.gguf")["path"])
    return gemma3_270m() if precision == "gemma3" else smollm2(precision)


# bf16 / q5_1 / tiny-q3_k_m (Q3_K, Q4_K, Q5_K, Q6_K) / tiny-q2_k (Q2_K, Q3_K, Q4_K, Q6_K) / tiny-iq3_s (IQ3_S, Q6_K) /
# tiny-iq1_s, tiny-iq1_m, tiny-iq2_xxs, tiny-iq2_xs (every layer matrix of that type, a flat importance matrix) /
# q4_0 / q4_k_m / iq4_nl / iq4_xs (IQ4_XS where rows allow, IQ4_NL elsewhere) / gemma3 (Q4_K, Q5_0, Q6_K, Q8_0): the
# files people download, through our kernels; gemma3 past 512 cells crosses its sliding window; tiny-moe-*: a random
# Qwen3 MoE (8 experts, 2 used), whose experts go through ggml's mul_mat_id (rows routed per expert)
@pytest.mark.slow
@pytest.mark.parametrize("precision,kv,n_context,n_threads", [
    *[(p, kv, n, 2) for p, kv in (("q4_1", "f16"), ("f16", "f16"), ("f32", "f32"), ("q4_1", "q8_0")) for n in (40, 600)],
    ("bf16", "f16", 40, 2), ("q5_1", "f16", 40, 2), ("tiny-q3_k_m", "f16", 40, 2), ("tiny-q2_k", "f16", 40, 2),
    ("tiny-iq3_s", "f16", 40, 2), ("tiny-iq1_s", "f16", 40, 2), ("tiny-iq1_m", "f16", 40, 2),
    ("tiny-iq2_xxs", "f16", 40, 2), ("tiny-iq2_xs", "f16", 40, 2), ("tiny-moe-q4_k_m", "f16", 40, 2), ("tiny-moe-q4_0", "f16", 40, 2),
    ("q4_0", "f16", 40, 2), ("q4_k_m", "f16", 40, 2), ("iq4_nl", "f16", 40, 2), ("iq4_xs", "f16", 40, 2),
    ("gemma3", "f16", 40, 2), ("gemma3", "f16", 600, 2), ("q4_k_m", "f16", 40, 1), ("q4_k_m", "f16", 600, 1)])
def test_verify_rows_equal_single_token_logits(precision, kv, n_context, n_threads):
    model = Model(_target_file(precision))
    target = Target(model, ContextSettings(n_ctx=1024, n_batch=256, n_ubatch=256, n_threads=n_threads, type_k=kv,
                                           type_v=kv), max_verify=MAX_B)
    tokens = _tokens(model, n_context + MAX_B)
    context, block = tokens[:n_context], tokens[n_context:]
    target.prefill(context, None)
    alone = []
    for t in block:                                    # plain decoding: one token per call
        alone.append(np.array(target.decode_rows([t])[0]))
    target.keep(0, MAX_B)
    for b in range(2, MAX_B + 1):                      # the same tokens as verify batches
        rows = np.array(target.decode_rows(block[:b]))
        for i in range(b):
            diff = np.flatnonzero(rows[i].view(np.uint32) != alone[i].view(np.uint32))
            assert diff.size == 0, (f"{precision}/{kv} KV, context {n_context}: row {i} of B={b} differs from the "
                                    f"token alone in {diff.size} logits (max |d| "
                                    f"{np.abs(rows[i] - alone[i]).max():.3g})")
        target.keep(0, b)
    target.close()


# Flash attention sums a row's positions in chunks of 128 and folds the chunks' softmax states in order; where a
# token's K/V heads are too few for the threads (SmolLM2: 3 on 2 threads; Gemma 3: 1) the threads take the chunks
# of one row side by side and fold them after. One thread never splits, so the same tokens at 1, 2 and 3 threads, alone
# and as a verify of 16, compare the split with the unsplit sums (a fold out of order fails this).
@pytest.mark.slow
@pytest.mark.parametrize("precision", ["q4_k_m", "gemma3"])
def test_logits_equal_at_every_thread_count(precision):
    model = Model(_target_file(precision))
    tokens = _tokens(model, 1500 + MAX_B)
    context, block = tokens[:1500], tokens[1500:]
    logits = {}
    for n_threads in (1, 2, 3):
        target = Target(model, ContextSettings(n_ctx=2048, n_batch=256, n_ubatch=256, n_threads=n_threads),
                        max_verify=MAX_B)
        target.prefill(context, None)
        alone = [np.array(target.decode_rows([t])[0]) for t in block[:4]]
        target.keep(0, len(alone))
        logits[n_threads] = (np.array(alone), np.array(target.decode_rows(block)))
        target.close()
    for n_threads in (2, 3):
        for what, got, want in zip(("alone", "verify of 16"), logits[n_threads], logits[1]):
            diff = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
            assert diff.size == 0, (f"{precision}, context 1500, {n_threads} threads: {diff.size} logits of the tokens "
                                    f"{what} differ from one thread's")
