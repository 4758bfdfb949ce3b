"""Fixtures the test modules share (pytest finds them here, no import needed). Plain helper functions live
in tests/helpers/ and are imported as `helpers.<module>`."""

from __future__ import annotations

import pytest


# the convert tests' module-scoped trio: a tiny target, a drafter config, that drafter's upstream GGUF
@pytest.fixture(scope="module")
def target(tmp_path_factory):
    from helpers.engine import write_tiny_llama
    return write_tiny_llama(tmp_path_factory.mktemp("t") / "target.gguf", n_vocab=64, n_embd=64, n_layer=3)


@pytest.fixture(scope="module")
def config():
    from dflash_gguf.drafter.config import DrafterConfig
    return DrafterConfig(hidden_size=64, intermediate_size=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                         target_layers=[1, 3], block_size=8, mask_token_id=5, vocab_size=64)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory, target, config):
    from dflash_gguf.convert.writer import write_dflash_gguf
    from helpers.convert import random_drafter, state_numpy
    out = tmp_path_factory.mktemp("u") / "upstream.gguf"
    return write_dflash_gguf(state_numpy(random_drafter(config)), config, target, out, outtype="f32")


@pytest.fixture(scope="module", autouse=True)
def gpu_backend(request):
    """In a module marked `gpu` (pytestmark), every test needs a device: skips without one (fails with
    DFLASH_GGUF_REQUIRE_GPU=1); the ggml backend's name. Module-scoped and autouse, so it runs before the
    module's other fixtures load a model."""
    if request.node.get_closest_marker("gpu"):
        from helpers.gpu import device_or_skip
        return device_or_skip()
    return None


# the CPU kernel tests' native build and its kernel-variant switch (the variant chosen at start restored at the end)
@pytest.fixture(scope="module")
def native():
    from dflash_gguf.native.lib import load
    return load()


@pytest.fixture(scope="module")
def kernels(native):
    from dflash_gguf.native.cpu_kernels import CpuKernels
    k = CpuKernels(native)
    chosen = k.isa                      # the best variant, or the one DFLASH_CPU_ISA named
    yield k
    k.set_isa(chosen)
