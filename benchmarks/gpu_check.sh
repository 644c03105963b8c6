#!/usr/bin/env bash
# The GPU check, for the one H200 this project can reach (Python 3.12, jax 0.11.2 with its CUDA 13
# plugin, PyTorch 2.11, no network, 64 MiB of files carried in, under 8 minutes):
#
#   compile tiny for gpu-h200-1 on that machine -> gate it (two fresh serving processes: zero
#   compiles after load, bit-exact twins) -> time to ready from the artifact against the JIT path with
#   a warm JAX cache -> the steady chunk against its deadline -> `avatar-release autotune` (measure on the
#   GPU, compile again requiring every config); JSON written for committing with its date.
#
# NOT YET RUN. Written on 2026-12-02 on a CPU-only host: no GPU was lent to that task. Its steps
# ran there end to end for cpu-8 (`python3 benchmarks/gpu_check.py --target cpu-8 --smoke`), not
# for a GPU. What is expected to block it on that machine, and what it would take, is in
# docs/how-to/gpu-builds.md ("The H200 check"): chiefly, this checkout pins Python 3.11 and jax/jaxlib 0.10.2
# (the restricted unpickler's class list, the target descriptions and the flag names are checked
# against them), and the bundled pipeline needs torchax, which that machine may not have.
#
#   bash benchmarks/gpu_check.sh [OUT.json]    # default: $OUT/gpu-h200.json where $OUT is set, else
#                                              # benchmarks/results/gpu-h200.json
set -euo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
RESULT=${1:-${OUT:+$OUT/gpu-h200.json}}
RESULT=${RESULT:-benchmarks/results/gpu-h200.json}

# No network: nothing is fetched. The package runs from this checkout (pip would refuse to install
# it on Python 3.12: pyproject says requires-python <3.12). Wheels carried in beside this script
# (benchmarks/wheels/*.whl, e.g. a torchax that imports with that machine's torch) are installed
# without an index and without dependencies.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G "benchmarks/wheels/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps benchmarks/wheels/*.whl
fi
# The GPU, and the CPU backend the toolchain's cost analysis runs on; the gate's keys made here.
export JAX_PLATFORMS=cuda,cpu
export AVATAR_RELEASE_CONFIG_DIR="${AVATAR_RELEASE_CONFIG_DIR:-$(mktemp -d)}"
python3 --version
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi: not found"

# 470 s for the steps (tiny: compile, gate, serve, JIT twice, autotune; each under its own limit
# in gpu_check.py, so a hung step still leaves the JSON), under the 8 minutes with the start-up.
timeout 470 python3 benchmarks/gpu_check.py --target gpu-h200-1 --pipeline tiny --out "$RESULT"
echo "gpu check done in $(( $(date +%s) - START )) s: $RESULT (commit it with its date)"
