#!/usr/bin/env bash
# GPU check entry point (see tools/gpu/README.md): runs tools/gpu/check.py with the repository's .venv Python
# where there is one (the CPU machine), else the machine's python3 (the GPU machine: nothing is installed there).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=python3
[ -x .venv/bin/python ] && PY="$PWD/.venv/bin/python"
exec "$PY" tools/gpu/check.py --python "$PY" "$@"
