#!/usr/bin/env bash
# Creates ./.venv, installs torch and the build/test dependencies, and builds
# baracuda_ops in place (CPU kernels always; CUDA kernels when torch has CUDA and
# nvcc is found). Environment: PYTHON (default python3), TORCH_VERSION (default
# 2.14.1), CUDA_HOME (default /usr/local/cuda when nvcc is there),
# TORCH_CUDA_ARCH_LIST (default 9.0), MAX_JOBS (default 2), BARACUDA_FORCE_CPU=1.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q "torch==${TORCH_VERSION:-2.14.1}" ninja setuptools wheel pytest expecttest matplotlib transformers
if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDA_HOME=/usr/local/cuda
fi
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-2}
.venv/bin/python -m pip install -q --no-build-isolation --no-deps -e .
.venv/bin/python -c 'import baracuda_ops; print("installed:", baracuda_ops.build_info())'
