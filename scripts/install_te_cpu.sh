#!/usr/bin/env bash
# Install Transformer Engine (PyTorch) into the active Python environment on a machine without a GPU.
# TE's PyTorch extension ships only as an sdist that compiles against the installed CUDA build of torch
# (~13 min on 2 cores), so the built wheel is cached outside the checkout, keyed by TE, torch and Python
# versions, and reused on later runs (seconds). docs/te-on-cpu.md says why each variable is set.
#
# --build-only: only put the compiled wheel in the cache, built in a venv of its own beside the cache
# (torch==$TE_TORCH, by default 2.14.1, the version the README installs), leaving the active environment
# as it is. .ci/run starts it in the background, at the lowest priority, while the tests run.
set -euo pipefail

TE_VERSION="${TE_VERSION:-2.20.2}"
PY=${PYTHON:-python}
CACHE_ROOT="${TE_ASSEMBLY_CACHE:-$HOME/.cache/te_assembly}"
BUILD_ONLY=0
if [ "${1:-}" = "--build-only" ]; then
  BUILD_ONLY=1
  TAG=$(python3 -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  if ls "$CACHE_ROOT/te-wheels/te${TE_VERSION}-torch${TE_TORCH:-2.14.1}+"*"-$TAG"/transformer_engine_torch-*.whl \
      >/dev/null 2>&1; then
    echo "[install_te_cpu] a compiled extension is already cached under $CACHE_ROOT/te-wheels"; exit 0
  fi
  BUILD_VENV="$CACHE_ROOT/build-venv"
  [ -x "$BUILD_VENV/bin/python" ] || python3 -m venv "$BUILD_VENV"
  PY="$BUILD_VENV/bin/python"
  $PY -m pip install -q --disable-pip-version-check "torch==${TE_TORCH:-2.14.1}"
fi

if [ "$BUILD_ONLY" = 0 ] && $PY - <<PYEOF 2>/dev/null
import torch, transformer_engine, transformer_engine.pytorch  # noqa: F401
assert transformer_engine.__version__ == "$TE_VERSION"
PYEOF
then
  echo "[install_te_cpu] transformer-engine $TE_VERSION already importable"; exit 0
fi

TORCH_VERSION=$($PY -c 'import torch; print(torch.__version__)')
PY_TAG=$($PY -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
case "$TORCH_VERSION" in *+cu*) ;; *) echo "[install_te_cpu] torch $TORCH_VERSION is not a CUDA build; TE's extension needs one" >&2; exit 1;; esac
CACHE="$CACHE_ROOT/te-wheels/te${TE_VERSION}-torch${TORCH_VERSION}-${PY_TAG}"
mkdir -p "$CACHE"
if [ "$BUILD_ONLY" = 1 ] && ls "$CACHE"/transformer_engine_torch-*.whl >/dev/null 2>&1; then
  echo "[install_te_cpu] a compiled extension is already cached in $CACHE"; exit 0
fi

echo "[install_te_cpu] TE core + Python package + runtime deps"
$PY -m pip install -q "transformer-engine==$TE_VERSION" "transformer-engine-cu13==$TE_VERSION" \
  pybind11 ninja wheel "nvidia-cudnn-frontend>=1.29.0" einops onnxscript onnx nvdlfw-inspect numpy

if ! ls "$CACHE"/transformer_engine_torch-*.whl >/dev/null 2>&1; then
  echo "[install_te_cpu] no cached extension wheel in $CACHE: compiling (about 13 minutes on 2 cores)"
  SP=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  TMP=$(mktemp -d)
  NVTE_PYTORCH_FORCE_BUILD=TRUE MAX_JOBS="${MAX_JOBS:-$(nproc)}" CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" \
  NVTE_BUILD_USE_NVIDIA_WHEELS=1 CPLUS_INCLUDE_PATH="$SP/include:${CUDA_HOME:-/usr/local/cuda}/include" \
    $PY -m pip wheel --no-build-isolation --no-deps -w "$TMP" "transformer-engine-torch==$TE_VERSION"
  # Move into place only when complete, so an interrupted build never leaves a broken cache entry.
  mv "$TMP"/transformer_engine_torch-*.whl "$CACHE"/
  rm -rf "$TMP"
fi
if [ "$BUILD_ONLY" = 1 ]; then
  echo "[install_te_cpu] compiled extension cached in $CACHE"; exit 0
fi
$PY -m pip install -q --no-deps "$CACHE"/transformer_engine_torch-*.whl
$PY -c 'import torch, transformer_engine, transformer_engine.pytorch as te; print("[install_te_cpu] transformer_engine", transformer_engine.__version__, "ready")'
