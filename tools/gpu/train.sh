#!/usr/bin/env bash
# Drafter training on the GPU machine (the `train` step of tools/gpu/check.sh, run beside the CUDA build):
# the torch target harvests the shipped prompts (pre-tokenized by tools/gpu/prepare_train.py and carried as
# .gpu-bundle/train-prompts.npz), the drafter trains on the GPU, and $OUT receives the drafter GGUF, the
# harvested tokens and train-job.json. A second call continues both (state in .gpu-state/train).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: train.sh OUT}
PY=${PYTHON:-python3}
[ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ] && PY="$PWD/.venv/bin/python"
PROMPTS=.gpu-bundle/train-prompts.npz
[ -f "$PROMPTS" ] || PROMPTS=.gpu-state/bundle/files/train/train-prompts.npz
TARGET=${DFLASH_GGUF_TRAIN_TARGET:-$("$PY" -c 'from dflash_gguf.packaged_models import smollm2_q4_1; print(smollm2_q4_1())')}
exec "$PY" tools/gpu/train_job.py "$OUT" --target "$TARGET" --prompts-npz "$PROMPTS" \
    --harvest-seconds "${HARVEST_SECONDS:-240}" --train-seconds "${TRAIN_SECONDS:-220}" "${@:2}"
