"""The verify-cost curve is cached per CPU kernel variant and per build: DFLASH_CPU_ISA=avx2 on an AVX-512 machine
times other kernels, and so does a new build of the kernels (its key names the patches and kernels); a curve measured
with one must not steer the policy of another."""

import json

from dflash_gguf.engine import session as session_module
from dflash_gguf.engine.session import Engine
from dflash_gguf.native.cpu_kernels import CpuKernels
from dflash_gguf.native.lib import load
from dflash_gguf.settings import EngineSettings


def test_cost_curves_are_cached_per_cpu_kernel_variant(monkeypatch, tmp_path):
    monkeypatch.setattr(session_module, "cache_root", lambda: tmp_path)
    kernels = CpuKernels(load())
    first = kernels.isa
    try:
        variants = []
        for isa in dict.fromkeys([first, "avx2"]):
            assert kernels.set_isa(isa), f"this CPU cannot run {isa}"
            Engine(EngineSettings(n_ctx=256, n_threads=1)).close()
            variants.append(isa)
        keys = list(json.loads((tmp_path / "cost-curves.json").read_text()))
    finally:
        kernels.set_isa(first)
    assert len(keys) == len(variants)
    for isa in variants:
        assert sum(f"|cpu-{isa}|" in k for k in keys) == 1, keys
    assert all(f"|{load().lib_dir.name}|" in k for k in keys), keys   # fails when the build is left out of the key
