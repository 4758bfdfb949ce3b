"""--fit placement planning from GGUF sizes (pure arithmetic; the GPU itself is not needed)."""

import pytest

from dflash_gguf.engine.fit import MIB, ModelSizes, plan_fit, read_sizes
from dflash_gguf.errors import UserError
from helpers.engine import write_tiny_llama


def _moe(n_layer=4, dense=100 * MIB, experts=400 * MIB, out=50 * MIB, kv=1024):
    return ModelSizes(n_layer, [dense] * n_layer, [experts] * n_layer, out, kv)


def test_everything_fits():
    plan = plan_fit(_moe(), None, 1024, None, free_bytes=10_000 * MIB, margin_bytes=0, compute_bytes=0)
    assert (plan.n_gpu_layers, plan.n_cpu_moe) == (5, 0)


def test_experts_move_to_cpu_before_layers_do():
    # 4 × (100 + 400) + 50 = 2050 MiB needed; 1300 MiB free → experts of 2 layers on the CPU (1250 MiB)
    plan = plan_fit(_moe(kv=0), None, 1024, None, free_bytes=1300 * MIB, margin_bytes=0, compute_bytes=0)
    assert (plan.n_gpu_layers, plan.n_cpu_moe) == (5, 2)
    assert plan.gpu_bytes == 1250 * MIB


def test_drafter_and_its_kv_are_counted():
    drafter = ModelSizes(1, [300 * MIB], [0], 0, kv_bytes_per_token=1024)
    free = 2050 * MIB
    assert plan_fit(_moe(kv=0), None, 1024, None, free, 0, 0).n_cpu_moe == 0
    with_drafter = plan_fit(_moe(kv=0), drafter, 1024, None, free, 0, 0)
    assert with_drafter.n_cpu_moe == 1                            # 300 MiB + 1 MiB of draft KV pushed one layer out
    windowed = plan_fit(_moe(kv=0), drafter, 1 << 20, 2048, free, 0, 0)   # 1M-token context, 2k draft window
    assert windowed.n_cpu_moe == 1


def test_dense_model_drops_layers_and_too_small_is_an_error():
    dense = ModelSizes(4, [500 * MIB] * 4, [0] * 4, 100 * MIB, 0)
    assert plan_fit(dense, None, 1024, None, 1200 * MIB, 0, 0).n_gpu_layers == 2
    with pytest.raises(UserError, match="not even the drafter"):
        plan_fit(dense, ModelSizes(1, [900 * MIB], [0], 0, 0), 1024, None, 800 * MIB, 0, 0)


def test_read_sizes_from_gguf(tmp_path):
    path = write_tiny_llama(tmp_path / "moe.gguf", arch="qwen3moe", n_layer=3, n_embd=64, n_ff=128, n_expert=4)
    s = read_sizes(path, 1024)
    assert s.n_layer == 3
    assert s.expert_bytes == [3 * 4 * 128 * 64 * 4] * 3                  # gate, up, down × 4 experts, F32
    assert s.kv_bytes_per_token == 3 * 2 * (16 + 16) * 2                 # layers × kv heads × (k+v dims) × F16
    # -ctk q8_0 -ctv q4_0: 34 bytes per 32 values of K, 18 per 32 of V
    assert read_sizes(path, 1024, "q8_0", "q4_0").kv_bytes_per_token == 3 * 2 * (16 * 34 // 32 + 16 * 18 // 32)
