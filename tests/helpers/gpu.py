"""What the device tests share: skip (or fail) without a GPU build that sees a device; which device it is."""

from __future__ import annotations

import os

import pytest

from dflash_gguf.native.wrappers import ContextSettings

ALL_LAYERS = 99
SETTINGS = ContextSettings(n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2)


def device_or_skip() -> str:
    """The ggml backend of the loaded build (cuda, vulkan, metal) when it sees a GPU-type device.

    Skips without one; with DFLASH_GGUF_REQUIRE_GPU=1 (the GPU check and the Vulkan child set it) that is
    a failure instead."""
    from dflash_gguf.native.lib import NativeLibraryError, load
    from dflash_gguf.native.offload import gpu_free_bytes
    try:
        native = load()
        backend = native.info.get("backend")
        reason = (None if backend != "cpu" and gpu_free_bytes(native) else
                  "the native build is the CPU one" if backend == "cpu" else f"no {backend} device visible")
    except NativeLibraryError as e:
        backend, reason = None, str(e)
    if reason:
        if os.environ.get("DFLASH_GGUF_REQUIRE_GPU"):
            pytest.fail(f"GPU required (DFLASH_GGUF_REQUIRE_GPU): {reason}")
        pytest.skip(reason)
    return backend


NEAR_TIE = 0.02      # logit gap under which a device's batch and one-row kernels may pick different tokens


def near_tie_gap(target, prompt: list[int], ref: list[int], got: list[int]) -> float | None:
    """None when got == ref; else the target's own logit gap between the two tokens where they first differ
    (plain prefill of the common prefix, on the same device). The caller asserts it is a near-tie."""
    import numpy as np
    if got == ref:
        return None
    k = next((j for j, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))
    if k == min(len(got), len(ref)):
        return float("inf")                       # one is a prefix of the other: not a tie
    target.reset()
    logits = np.array(target.prefill(prompt + ref[:k], None))
    return abs(float(logits[ref[k]]) - float(logits[got[k]]))

