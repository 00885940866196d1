#!/usr/bin/env bash
# Prepare the directory scripts/gpu_check.sh installs Transformer Engine from, on a machine with
# internet access to PyPI (any OS with python3, pip and xz; no GPU needed).
#
#   scripts/prepare_gpu_bundle.sh BUNDLE_DIR
#
# BUNDLE_DIR receives:
#   transformer_engine-$TE_VERSION-py3-none-any.whl          TE's Python package
#   transformer_engine_cu13-$TE_VERSION-*.whl                TE's core wheel minus its 343 MB library
#                                                            (dist-info + headers; scripts/strip_te_core_wheel.py)
#   transformer_engine_torch-$TE_VERSION.tar.gz              the PyTorch extension, built on the GPU machine
#   libtransformer_engine.sm$ARCH.so.xz                      the core library with only sm_$ARCH cubins (te-slim)
#   deps/*.whl                                               runtime/build dependencies for Python $PY_VERSION
#
# Environment: TE_VERSION (2.20.2), PY_VERSION (3.12), ARCH (90), SLIM_TE (path to te-slim's slim_te.py).
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 BUNDLE_DIR" >&2
  exit 2
fi
REPO=$(cd "$(dirname "$0")/.." && pwd)
DEST=$1
TE_VERSION=${TE_VERSION:-2.20.2}
PY_VERSION=${PY_VERSION:-3.12}
ARCH=${ARCH:-90}
ABI="cp${PY_VERSION/./}"
PY=${PYTHON:-python3}
if [ -z "${SLIM_TE:-}" ]; then
  for candidate in "$REPO/shared/tools/te-slim/slim_te.py" "$REPO/../shared/tools/te-slim/slim_te.py"; do
    if [ -f "$candidate" ]; then SLIM_TE=$candidate; break; fi
  done
fi
if [ ! -f "${SLIM_TE:-}" ]; then
  echo "[prepare] te-slim's slim_te.py not found: set SLIM_TE=/path/to/slim_te.py" >&2
  exit 1
fi
command -v xz >/dev/null || { echo "[prepare] xz is required" >&2; exit 1; }

mkdir -p "$DEST/deps"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# Wheels for the GPU machine's interpreter and platform, whatever this machine runs.
TARGET=(--only-binary=:all: --python-version "$PY_VERSION" --implementation cp --abi "$ABI" --abi abi3 --abi none
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
        --platform any)
PIP=("$PY" -m pip download --no-deps --disable-pip-version-check)

echo "[prepare] TE $TE_VERSION wheels and sdist"
"${PIP[@]}" "${TARGET[@]}" -d "$WORK/te" "transformer-engine==$TE_VERSION" "transformer-engine-cu13==$TE_VERSION"
"${PIP[@]}" --no-binary=:all: -d "$WORK/te" "transformer-engine-torch==$TE_VERSION"
cp "$WORK"/te/transformer_engine-"$TE_VERSION"-py3-none-any.whl "$DEST"/
cp "$WORK"/te/transformer_engine_torch-"$TE_VERSION".tar.gz "$DEST"/
CORE_WHEEL=$(ls "$WORK"/te/transformer_engine_cu13-"$TE_VERSION"-*.whl)

echo "[prepare] core library for sm_$ARCH (te-slim), then xz"
"$PY" - "$CORE_WHEEL" "$WORK/core" <<'PYEOF'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extract("transformer_engine/wheel_lib/libtransformer_engine.so", sys.argv[2])
PYEOF
"$PY" "$SLIM_TE" --input "$WORK/core/transformer_engine/wheel_lib/libtransformer_engine.so" \
  --output "$WORK/libtransformer_engine.sm$ARCH.so" --keep-arch "$ARCH"
xz -9 -T2 -c "$WORK/libtransformer_engine.sm$ARCH.so" > "$DEST/libtransformer_engine.sm$ARCH.so.xz"
"$PY" "$REPO/scripts/strip_te_core_wheel.py" "$CORE_WHEEL" "$DEST"

echo "[prepare] dependency wheels for Python $PY_VERSION (gpu_check.sh installs only the missing ones)"
# Resolved together, so pins between them hold (pydantic pins pydantic-core exactly).
RESOLVED=(
  pydantic packaging einops onnx onnxscript numpy importlib-metadata   # TE runtime
  pybind11 ninja wheel setuptools                                      # building the extension (--no-build-isolation)
  pyyaml rich safetensors pytest                                       # te_assembly and its gpu tests
)
# Without their dependencies: those pull torch or large CUDA packages the GPU machine already has or
# does not need (nvidia-cudnn-frontend is needed for its headers).
UNRESOLVED=(nvdlfw-inspect "nvidia-cudnn-frontend>=1.29.0" hydra-core omegaconf)
"$PY" -m pip download --disable-pip-version-check "${TARGET[@]}" -d "$DEST/deps" "${RESOLVED[@]}"
"${PIP[@]}" "${TARGET[@]}" -d "$DEST/deps" "${UNRESOLVED[@]}"
# omegaconf's parser needs exactly ANTLR 4.9, which PyPI has only as an sdist.
"${PIP[@]}" --no-binary=:all: -d "$DEST/deps" "antlr4-python3-runtime==4.9.3"

echo "[prepare] done:"
ls -la "$DEST" "$DEST/deps"
du -sh "$DEST"
