"""The device tests on ggml's Vulkan backend, in a child pytest process that loads the Vulkan build.

One process loads one build of the patched llama.cpp, and this suite runs on the CPU build; so the
device tests (`tests/test_gpu_backend.py`, `tests/test_gpu_engine.py`, marked `gpu`) run again in a child
process with DFLASH_GGUF_BACKEND=vulkan and DFLASH_GGUF_REQUIRE_GPU=1, where a skip is a failure.
ggml hides CPU-type Vulkan devices (Mesa's lavapipe on a machine without a GPU) unless
GGML_VK_VISIBLE_DEVICES lists them: without a Vulkan GPU the child is given GGML_VK_VISIBLE_DEVICES=0.

Skipped where the Vulkan build or a Vulkan device is missing — a failure instead with
DFLASH_GGUF_REQUIRE_VULKAN=1 (CI sets it: `.ci/run` installs the toolchain and lavapipe).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEVICE_TESTS = ["tests/test_gpu_backend.py", "tests/test_gpu_engine.py", "tests/test_gpu_family.py"]


def _missing(reason: str) -> None:
    if os.environ.get("DFLASH_GGUF_REQUIRE_VULKAN"):
        pytest.fail(f"Vulkan required (DFLASH_GGUF_REQUIRE_VULKAN): {reason}")
    pytest.skip(reason)


def _doctor(env: dict) -> dict:
    proc = subprocess.run([sys.executable, "-m", "dflash_gguf.cli", "doctor", "--json"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"ok": False, "error": (proc.stderr or proc.stdout).strip()[-2000:]}


def vulkan_env() -> dict:
    """The environment for a child that runs on a Vulkan device; skips (or fails) when there is none."""
    env = dict(os.environ, DFLASH_GGUF_BACKEND="vulkan")
    env.pop("DFLASH_GGUF_LIB_DIR", None)
    report = _doctor(env)
    if not report.get("ok"):
        _missing(f"no Vulkan build: {report.get('error', '?')}")
    if not any(d["name"].startswith("Vulkan") for d in report["devices"]) and "GGML_VK_VISIBLE_DEVICES" not in env:
        env["GGML_VK_VISIBLE_DEVICES"] = "0"     # a CPU-type device (lavapipe): used only when asked
        report = _doctor(env)
    devices = [d for d in report.get("devices", []) if d["name"].startswith("Vulkan")]
    if not devices:
        _missing("the Vulkan build sees no device (install a Vulkan driver, e.g. mesa-vulkan-drivers)")
    print("Vulkan devices:", ", ".join(f"{d['name']} {d['description']} ({d['memory_total_mib']} MiB)"
                                       for d in devices))
    return env


def test_device_tests_pass_on_vulkan():
    env = vulkan_env()
    env.update(DFLASH_GGUF_REQUIRE_GPU="1", PYTHONFAULTHANDLER="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-s", "--durations=12",
                           *DEVICE_TESTS], env=env, cwd=ROOT, capture_output=True, text=True, timeout=2400)
    out = proc.stdout + proc.stderr
    print(out[-20000:])
    # pytest's last line of stdout (stderr may carry the tests' own messages after it)
    summary = next((line for line in reversed(proc.stdout.strip().splitlines())
                    if re.search(r"\d+ (passed|failed)|error", line)), "")
    assert proc.returncode == 0, f"device tests failed on Vulkan (exit {proc.returncode}): {summary}"
    assert re.search(r"\d+ passed", summary) and "skipped" not in summary, summary
