#!/usr/bin/env bash
# Everything a GPU window needs, made and checked on the CPU machine (tools/gpu/README.md), in one command:
#   1. the CUDA build for $DFLASH_GGUF_CUDA_ARCH (default 90: H100, H200) with the window's tools; no GPU and no CUDA
#      toolkit needed (what is missing comes from the package index); cached, so a second run takes seconds
#   2. the sizes of its libraries, raw and as xz
#   3. the bundle, .gpu-bundle/unit-N, with those libraries prebuilt
#   4. the CPU dry run from the bundle's own files: `doctor`, `run --compare`, then every step of the check with
#      the tiny profile; the CUDA libraries load here and fall back to the CPU
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
ARCH=${DFLASH_GGUF_CUDA_ARCH:-90}
DRY=${DRY:-$(mktemp -d)}
t0=$(date +%s)
mkdir -p "$DRY"
nice -n 10 "$PY" -c "import sys; from dflash_gguf.native.build import build
print(build('cuda', tools=['llama-speculative-simple', 'llama-bench'], cuda_arch=sys.argv[1]))" "$ARCH" 2>&1 \
    | tee "$DRY/build.log"
lib=$(tail -1 "$DRY/build.log")
echo "== CUDA build $lib: $(( $(date +%s) - t0 )) s in this run; build.json: $(grep -h '"seconds"' "$lib/build.json" "$lib/tools/build.json" | tr -d ' \n')"
# ggml-cuda's objects compile once, with the libraries (144 from nothing, 0 when they were built before)
echo "== CUDA objects compiled in this run: $(grep -c 'Building CUDA object' "$DRY/build.log" || true)"
echo "== sizes (MiB raw / xz -6)"
for f in "$lib"/*.so* "$lib"/tools/llama-speculative-simple "$lib"/tools/llama-bench; do
    printf '%-32s %7.1f %7.1f\n' "$(basename "$f")" "$(stat -c %s "$f" | awk '{print $1/1048576}')" \
        "$(nice -n 10 xz -6 -T1 -c "$f" | wc -c | awk '{print $1/1048576}')"
done
echo "== bundle"
nice -n 10 "$PY" tools/gpu/bundle.py
du -sm .gpu-bundle/unit-*
echo "== doctor and run --compare, CUDA build, this machine"
DFLASH_GGUF_BACKEND=cuda "$PY" -m dflash_gguf.cli doctor --json --backend cuda
"$PY" -m dflash_gguf.cli run --backend cuda --compare -n 32 -t 2
echo "== CPU dry run of the check from the bundle (state in $DRY)"
bash tools/gpu/check.sh --backend cuda --profile tiny --bundle .gpu-bundle --state "$DRY/state" --out "$DRY/out" \
    --threads 2 --timeout tests=900 --timeout bench=900 --timeout moe=600 --timeout verify8b=600 --timeout verify=600 \
    --steps setup,build,tests,verify8b,moe,bench,verify
