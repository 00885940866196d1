#!/usr/bin/env bash
# One command for a Hopper (sm_90) GPU machine that has torch (CUDA 13 build) but neither Transformer
# Engine nor internet: install TE from a bundle made by scripts/prepare_gpu_bundle.sh, check TE's kernels
# against plain torch, run the gpu test tier and a short benchmark. Budget: under 8 minutes.
#
#   scripts/gpu_check.sh BUNDLE_DIR [OUT_DIR]
#
# OUT_DIR (default: $OUT, else ./gpu_check_out) receives gpu_check.log, pytest-gpu.xml and the build log.
# If the interpreter's site-packages is read-only, everything is installed into OUT_DIR/site (put on
# PYTHONPATH). Environment: PYTHON (python3), TE_VERSION (2.20.2), CUDA_HOME (/usr/local/cuda).
set -euo pipefail

if [ $# -lt 1 ] || [ ! -d "$1" ]; then
  echo "usage: $0 BUNDLE_DIR [OUT_DIR]" >&2
  exit 2
fi
BUNDLE=$(cd "$1" && pwd)
OUT_DIR=${2:-${OUT:-$PWD/gpu_check_out}}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
exec > >(tee -a "$OUT_DIR/gpu_check.log") 2>&1

PY=${PYTHON:-python3}
TE_VERSION=${TE_VERSION:-2.20.2}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
# Load every kernel module at context creation: a cubin missing from the slimmed library fails here,
# up front, instead of at some later first launch.
export CUDA_MODULE_LOADING=EAGER
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INDEX=1

log() { echo "[gpu_check +${SECONDS}s] $*"; }
die() { echo "[gpu_check +${SECONDS}s] FAILED: $*" >&2; exit 1; }

need() { [ -e "$1" ] || die "missing from the bundle: $1 (make it with scripts/prepare_gpu_bundle.sh)"; }
TE_WHEEL="$BUNDLE/transformer_engine-$TE_VERSION-py3-none-any.whl"
TE_SDIST="$BUNDLE/transformer_engine_torch-$TE_VERSION.tar.gz"
SLIM_LIB="$BUNDLE/libtransformer_engine.sm90.so.xz"
need "$TE_WHEEL"
need "$TE_SDIST"
need "$SLIM_LIB"
CORE_WHEEL=$(find "$BUNDLE" -maxdepth 1 -name "transformer_engine_cu13-$TE_VERSION-*.whl" | head -n 1)
[ -n "$CORE_WHEEL" ] || die "missing from the bundle: transformer_engine_cu13-$TE_VERSION-*.whl (stripped core wheel)"

log "1/6 machine"
"$PY" - <<'PYEOF' || die "this machine cannot run the sm_90 TE build (see above)"
import sys
import torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}")
assert torch.version.cuda and torch.version.cuda.startswith("13"), "torch is not a CUDA 13 build"
assert torch.cuda.is_available(), "no CUDA GPU visible"
cap = torch.cuda.get_device_capability()
print(f"GPU: {torch.cuda.get_device_name()} (sm_{cap[0]}{cap[1]}), {torch.cuda.device_count()} device(s)")
assert cap == (9, 0), f"the slimmed TE library holds sm_90 code only; this GPU is sm_{cap[0]}{cap[1]}"
PYEOF

log "2/6 install location"
SP=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ -w "$SP" ]; then
  SITE=$SP
  TARGET=()
else
  SITE="$OUT_DIR/site"
  mkdir -p "$SITE"
  TARGET=(--target "$SITE")
  export PYTHONPATH="$SITE:${PYTHONPATH:-}"
  export PATH="$SITE/bin:$PATH"
  log "site-packages $SP is read-only: installing into $SITE (on PYTHONPATH)"
fi
PIP=("$PY" -m pip install --no-index --no-deps)

log "3/6 dependencies missing here"
missing=()
for dep in "$BUNDLE"/deps/*.whl "$BUNDLE"/deps/*.tar.gz; do
  [ -e "$dep" ] || continue
  name=$(basename "$dep")
  name=${name%%-[0-9]*}
  if ! "$PY" -m pip show "$name" >/dev/null 2>&1; then
    missing+=("$dep")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${#missing[@]} package(s): $(for m in "${missing[@]}"; do basename "$m"; done | tr '\n' ' ')"
  # One pip call: with --target, a later call would not merge into directories an earlier one made.
  "${PIP[@]}" --no-build-isolation "${TARGET[@]}" "${missing[@]}"
else
  log "all dependencies already present"
fi

place_library() {
  local te_dir
  te_dir=$("$PY" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("transformer_engine").origin))')
  mkdir -p "$te_dir/wheel_lib"
  xz -dc "$SLIM_LIB" > "$te_dir/wheel_lib/libtransformer_engine.so"
  log "slimmed core library in place: $te_dir/wheel_lib/libtransformer_engine.so"
}

install_te() {
  # --upgrade: with --target, replaces the transformer_engine directory by the merge of these wheels.
  "${PIP[@]}" --upgrade "${TARGET[@]}" "$TE_WHEEL" "$CORE_WHEEL" "$@"
  place_library
}

log "4/6 TE $TE_VERSION Python package + core, then the PyTorch extension (MAX_JOBS=$(nproc))"
install_te
INCLUDES="$SP/include:$SITE/include:$CUDA_HOME/include"
WHEELS="$OUT_DIR/wheels"
mkdir -p "$WHEELS"
NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_BUILD_USE_NVIDIA_WHEELS=1 MAX_JOBS=$(nproc) \
CPLUS_INCLUDE_PATH="$INCLUDES${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}" \
  timeout 300 "$PY" -m pip wheel --no-index --no-deps --no-build-isolation -w "$WHEELS" "$TE_SDIST" \
  > "$OUT_DIR/build_extension.log" 2>&1 || { tail -n 40 "$OUT_DIR/build_extension.log"; die "building the extension"; }
EXT_WHEEL=$(find "$WHEELS" -maxdepth 1 -name "transformer_engine_torch-$TE_VERSION-*.whl" | head -n 1)
[ -n "$EXT_WHEEL" ] || die "the build produced no transformer_engine_torch wheel"
install_te "$EXT_WHEEL"
"$PY" -c 'import torch, transformer_engine, transformer_engine.pytorch; print("transformer_engine", transformer_engine.__version__)'

log "5/6 TE kernels against plain torch"
timeout 120 "$PY" scripts/gpu_sanity.py check || die "TE's kernels disagree with torch (or crashed): see above"

log "6/6 gpu test tier, then a short benchmark"
TE_ASSEMBLY_REQUIRE_TE=1 timeout 240 "$PY" -m pytest -m gpu -q -p no:cacheprovider tests/te \
  --junitxml "$OUT_DIR/pytest-gpu.xml" || die "pytest -m gpu"
if [ -f te_assembly/cli/commands/bench.py ]; then
  timeout 90 "$PY" -m te_assembly bench model=moe_block engine=te || die "bench"
else
  timeout 90 "$PY" scripts/gpu_sanity.py bench --model moe_block || die "bench"
fi
log "all checks passed; logs in $OUT_DIR"
