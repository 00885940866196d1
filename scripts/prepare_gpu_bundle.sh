#!/usr/bin/env bash
# Make the folder scripts/gpu_check.sh installs Transformer Engine from, on a machine with package-registry
# access and no GPU, for a GPU machine with torch but neither TE nor internet (the device image: Python
# 3.12, torch 2.11.0+cu130, an sm_90 H100/H200), and prove it on CPU before any GPU time is spent.
#
#   scripts/prepare_gpu_bundle.sh [BUNDLE_DIR]        (default: gpu_bundle/ in the repo, git-ignored)
#   scripts/prepare_gpu_bundle.sh --measure-only [BUNDLE_DIR]
#
# Then, on the GPU machine: scripts/gpu_check.sh BUNDLE_DIR  (the device tool carries BUNDLE_DIR).
#
# What goes in (only what the GPU image lacks; everything is cached under $CACHE, so a second run takes
# seconds):
#   te/transformer_engine-V-py3-none-any.whl          TE's Python package
#   te/transformer_engine_cu13-V-*.whl                TE's core wheel minus its 343 MB library
#                                                     (scripts/strip_te_core_wheel.py)
#   te/libtransformer_engine.sm90.so.xz               the core library with only sm_90 code (scripts/slim_te.py)
#   te/transformer_engine_torch-V-cp312-*.whl         the PyTorch extension, compiled HERE against the GPU
#                                                     image's Python and torch (~13 min on 2 cores, once)
#   te/transformer_engine_torch-V.tar.gz              its source, for gpu_check.sh's fallback build there
#   te/cudnn_frontend_include.tar.xz                  the C++ headers that fallback build needs
#   deps/*.whl                                        pinned Python packages the image does not have
#   MANIFEST.sha256, bundle.json                      checksums; versions and sizes
# The bundle plus the repository's files must stay under the device tool's 64 MiB per call: this script
# measures both and fails here when they do not fit.
#
# Environment: TE_VERSION (2.20.2), PY_VERSION (3.12), TORCH_VERSION (2.11.0, the GPU image's),
# TORCH_WHEEL (a local torch wheel to build against, else pip fetches torch==TORCH_VERSION), ARCH (90),
# BUILD_PYTHON (a python$PY_VERSION interpreter; found on PATH or under pyenv), CACHE
# (~/.cache/te_assembly), LIMIT_MIB (64), MAX_JOBS (nproc), SKIP_DRY_RUN=1 to skip the CPU dry run.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
MEASURE_ONLY=0
if [ "${1:-}" = "--measure-only" ]; then MEASURE_ONLY=1; shift; fi
if [ $# -gt 1 ] || [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 2
fi
DEST=${1:-$REPO/gpu_bundle}
TE_VERSION=${TE_VERSION:-2.20.2}
PY_VERSION=${PY_VERSION:-3.12}
TORCH_VERSION=${TORCH_VERSION:-2.11.0}
ARCH=${ARCH:-90}
LIMIT_MIB=${LIMIT_MIB:-64}
CACHE=${CACHE:-${TE_ASSEMBLY_CACHE:-$HOME/.cache/te_assembly}}
PY=${PYTHON:-python3}
PY_TAG="cp${PY_VERSION/./}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

log() { echo "[prepare +${SECONDS}s] $*"; }
die() { echo "[prepare] FAILED: $*" >&2; exit 1; }

# Packages the GPU image lacks (its list: "Python packages already there" in the device notes), pinned to
# the versions the CPU test tiers run with. TE needs pydantic (+ its three helpers) and nvdlfw-inspect;
# te_assembly needs hydra-core, omegaconf and ANTLR 4.9 (omegaconf's parser; on PyPI only as an sdist, so
# it is built into a wheel here). typing-extensions is carried because pydantic 2.14 needs >= 4.16:
# gpu_check.sh installs a carried package only where the image's copy is missing or older.
DEPS=(
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  typing-extensions==4.16.0 nvdlfw-inspect==0.2.2 hydra-core==1.3.8 omegaconf==2.3.1
)
ANTLR=antlr4-python3-runtime==4.9.3
CUDNN_FRONTEND=nvidia-cudnn-frontend==1.32.0   # headers only, for the fallback build

measure() {
  # Bytes that travel to the device: the repository's tracked and untracked-but-not-ignored files, plus
  # the bundle (carried). Fails when over LIMIT_MIB. A tracked file deleted but not yet committed is
  # listed by git and gone from disk: it travels as nothing (stat's failure for it is not the script's).
  local bundle_bytes tree_bytes total limit
  bundle_bytes=$(du -sb "$DEST" | cut -f1)
  tree_bytes=$(cd "$REPO" && git ls-files -z --cached --others --exclude-standard \
    | { xargs -0 -r stat -c %s 2>/dev/null || true; } | awk '{s += $1} END {print s + 0}')
  total=$((bundle_bytes + tree_bytes))
  limit=$((LIMIT_MIB * 1024 * 1024))
  awk -v b="$bundle_bytes" -v t="$tree_bytes" -v l="$LIMIT_MIB" 'BEGIN {
    printf "[prepare] size: bundle %.1f MiB + repository files %.1f MiB = %.1f MiB (limit %s MiB per call)\n",
      b / 1048576, t / 1048576, (b + t) / 1048576, l }'
  (cd "$DEST" && find . -type f -printf '%s\t%p\n' | sort -rn | awk -F'\t' '{printf "[prepare]   %8.2f MiB  %s\n", $1 / 1048576, $2}')
  if [ "$total" -gt "$limit" ]; then
    die "the bundle and the repository come to $total bytes, over the ${LIMIT_MIB} MiB the device tool carries in one call"
  fi
  if [ -f "$DEST/bundle.json" ]; then
    "$PY" - "$DEST/bundle.json" "$bundle_bytes" "$tree_bytes" <<'PYEOF'
import json, sys
path, bundle, tree = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
doc = json.load(open(path))
doc["bytes"] = {"bundle": bundle, "repository": tree, "total": bundle + tree}
json.dump(doc, open(path, "w"), indent=2)
PYEOF
  fi
}

if [ "$MEASURE_ONLY" = 1 ]; then
  [ -d "$DEST" ] || die "no bundle at $DEST"
  measure
  exit 0
fi

command -v xz >/dev/null || die "xz is required"
DEST=$(mkdir -p "$DEST" && cd "$DEST" && pwd)
case "$DEST/" in
  "$REPO"/*)  # inside the repository it must be ignored, or git would see 30 MB of wheels
    (cd "$REPO" && git check-ignore -q "$DEST/") || die "$DEST is in the repository but not git-ignored (.gitignore)";;
esac

DL="$CACHE/downloads"
mkdir -p "$DL"
WHEEL_TARGET=(--only-binary=:all: --python-version "$PY_VERSION" --implementation cp --abi "$PY_TAG" --abi abi3
              --abi none --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
              --platform manylinux2014_x86_64 --platform any)

log "1/7 build environment: Python $PY_VERSION + torch $TORCH_VERSION, as on the GPU image"
BUILD_VENV="$CACHE/build-py$PY_VERSION-torch$TORCH_VERSION"
BUILD_PY="$BUILD_VENV/bin/python"
find_build_python() {
  local candidate
  for candidate in "${BUILD_PYTHON:-}" "$(command -v "python$PY_VERSION" || true)" \
      "$HOME"/.pyenv/versions/"$PY_VERSION".*/bin/python"$PY_VERSION"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ] \
        && [ "$("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = "$PY_VERSION" ]; then
      echo "$candidate"; return 0
    fi
  done
  return 1
}
if [ ! -f "$BUILD_VENV/.ready" ]; then
  base=$(find_build_python) || die "no Python $PY_VERSION found: set BUILD_PYTHON=/path/to/python$PY_VERSION"
  log "build environment: $BUILD_VENV (from $base)"
  "$base" -m venv --clear "$BUILD_VENV"
  "$BUILD_PY" -m pip install -q "${TORCH_WHEEL:-torch==$TORCH_VERSION}" pybind11 ninja wheel "setuptools<82"
  touch "$BUILD_VENV/.ready"   # venvs are not relocatable, so completeness is marked rather than moved
fi
BUILT_TORCH=$("$BUILD_PY" -c 'import torch; print(torch.__version__)')
case "$BUILT_TORCH" in "$TORCH_VERSION"+cu13*) ;; *) die "the build environment has torch $BUILT_TORCH, not $TORCH_VERSION+cu13x";; esac

log "2/7 downloads (cached in $DL)"
"$PY" -m pip download -q --no-deps -d "$DL/te" "transformer-engine==$TE_VERSION" "transformer-engine-cu13==$TE_VERSION" \
  "${WHEEL_TARGET[@]}"
# pip prepares an sdist's metadata even to download it, which needs torch: the build environment has it.
"$BUILD_PY" -m pip download -q --no-deps --no-binary=:all: --no-build-isolation -d "$DL/te" \
  "transformer-engine-torch==$TE_VERSION"
"$PY" -m pip download -q --no-deps -d "$DL/deps" "${WHEEL_TARGET[@]}" "${DEPS[@]}" "$CUDNN_FRONTEND"
if ! ls "$DL"/deps/antlr4_python3_runtime-4.9.3-*.whl >/dev/null 2>&1; then
  "$PY" -m pip wheel -q --no-deps -w "$DL/deps" "$ANTLR"
fi
TE_WHEEL=$(ls "$DL"/te/transformer_engine-"$TE_VERSION"-py3-none-any.whl)
CORE_WHEEL=$(ls "$DL"/te/transformer_engine_cu13-"$TE_VERSION"-*.whl)
SDIST=$(ls "$DL"/te/transformer_engine_torch-"$TE_VERSION".tar.gz)

log "3/7 core library slimmed to sm_$ARCH (scripts/slim_te.py), xz"
SLIM="$CACHE/slim/te$TE_VERSION-sm$ARCH"
if [ ! -f "$SLIM/libtransformer_engine.sm$ARCH.so.xz" ]; then
  mkdir -p "$SLIM/tmp"
  "$PY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("transformer_engine/wheel_lib/libtransformer_engine.so", sys.argv[2])' \
    "$CORE_WHEEL" "$SLIM/tmp"
  "$PY" "$REPO/scripts/slim_te.py" --input "$SLIM/tmp/transformer_engine/wheel_lib/libtransformer_engine.so" \
    --output "$SLIM/tmp/libtransformer_engine.sm$ARCH.so" --keep-arch "$ARCH"
  xz -9 -T2 -c "$SLIM/tmp/libtransformer_engine.sm$ARCH.so" > "$SLIM/tmp/lib.xz"
  mv "$SLIM/tmp/lib.xz" "$SLIM/libtransformer_engine.sm$ARCH.so.xz"   # complete files only in the cache
  rm -rf "$SLIM/tmp"
fi
if [ ! -f "$SLIM/$(basename "$CORE_WHEEL")" ]; then
  "$PY" "$REPO/scripts/strip_te_core_wheel.py" "$CORE_WHEEL" "$SLIM" >/dev/null
fi
if [ ! -f "$SLIM/cudnn_frontend_include.tar.xz" ]; then
  rm -rf "$SLIM/hdr" && mkdir -p "$SLIM/hdr"
  "$PY" -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/")])' "$(ls "$DL"/deps/nvidia_cudnn_frontend-*.whl)" "$SLIM/hdr"
  tar cJf "$SLIM/hdr.tar.xz" -C "$SLIM/hdr" include && mv "$SLIM/hdr.tar.xz" "$SLIM/cudnn_frontend_include.tar.xz"
  rm -rf "$SLIM/hdr"
fi

log "4/7 the PyTorch extension for Python $PY_VERSION + torch $BUILT_TORCH (the GPU image's)"
EXT_DIR="$CACHE/te-wheels/te$TE_VERSION-torch$TORCH_VERSION+cu130-$PY_TAG"
if ! ls "$EXT_DIR"/transformer_engine_torch-"$TE_VERSION"-"$PY_TAG"-*.whl >/dev/null 2>&1; then
  log "compiling transformer_engine_torch $TE_VERSION (about 13 minutes on 2 cores; cached afterwards)"
  SP=$("$BUILD_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$BUILD_PY" -m pip install -q --no-deps "$TE_WHEEL" "$CORE_WHEEL" "$(ls "$DL"/deps/nvidia_cudnn_frontend-*.whl)"
  TMP=$(mktemp -d)
  NVTE_PYTORCH_FORCE_BUILD=TRUE MAX_JOBS="${MAX_JOBS:-$(nproc)}" CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" \
  NVTE_BUILD_USE_NVIDIA_WHEELS=1 CPLUS_INCLUDE_PATH="$SP/include:${CUDA_HOME:-/usr/local/cuda}/include" \
  PATH="$BUILD_VENV/bin:$PATH" \
    "$BUILD_PY" -m pip wheel -q --no-build-isolation --no-deps --no-index -w "$TMP" "$SDIST"
  mkdir -p "$EXT_DIR"
  mv "$TMP"/transformer_engine_torch-*.whl "$EXT_DIR"/
  rm -rf "$TMP"
  # The build environment doubles as a stand-in for the GPU image in the dry run below, and the image
  # has no TE: take it out again.
  "$BUILD_PY" -m pip uninstall -q -y transformer_engine transformer_engine_cu13 nvidia-cudnn-frontend
  rm -rf "$SP/transformer_engine"   # folders pip leaves behind
fi
EXT_WHEEL=$(ls "$EXT_DIR"/transformer_engine_torch-"$TE_VERSION"-"$PY_TAG"-*.whl)

log "5/7 assembling $DEST"
rm -rf "$DEST.tmp"
mkdir -p "$DEST.tmp/te" "$DEST.tmp/deps"
cp "$TE_WHEEL" "$EXT_WHEEL" "$SDIST" "$SLIM/$(basename "$CORE_WHEEL")" "$SLIM/libtransformer_engine.sm$ARCH.so.xz" \
  "$SLIM/cudnn_frontend_include.tar.xz" "$DEST.tmp/te/"
for dep in "${DEPS[@]}" "$ANTLR"; do
  name=${dep%%==*}; version=${dep##*==}
  file=$(ls "$DL"/deps/"${name//-/_}"-"$version"-*.whl 2>/dev/null | head -n 1)
  [ -n "$file" ] || die "no wheel for $dep in $DL/deps"
  cp "$file" "$DEST.tmp/deps/"
done
(cd "$DEST.tmp" && find te deps -type f | sort | xargs sha256sum > MANIFEST.sha256)
"$PY" - "$DEST.tmp/bundle.json" "$TE_VERSION" "$PY_VERSION" "$PY_TAG" "$TORCH_VERSION" "$BUILT_TORCH" "$ARCH" <<'PYEOF'
import json, sys, time
path, te, py, tag, torch_version, built_torch, arch = sys.argv[1:]
json.dump({
    "transformer_engine": te, "python": py, "python_tag": tag, "torch": torch_version,
    "extension_built_against": built_torch, "arch": f"sm_{arch}",
    "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
}, open(path, "w"), indent=2)
PYEOF
rm -rf "$DEST"
mv "$DEST.tmp" "$DEST"

log "6/7 measuring what travels"
measure

log "7/7 CPU dry run of scripts/gpu_check.sh with this bundle, on Python $PY_VERSION + torch $BUILT_TORCH"
if [ "${SKIP_DRY_RUN:-0}" = 1 ]; then
  log "skipped (SKIP_DRY_RUN=1)"
else
  # The device image has these; the dry run's stand-in for it needs them too (cached after the first run).
  "$BUILD_PY" -m pip install -q pyyaml rich safetensors matplotlib numpy einops onnx onnxscript packaging \
    pytest hypothesis
  DRY_OUT=$(mktemp -d)
  OUT="$DRY_OUT" PYTHON="$BUILD_PY" bash "$REPO/scripts/gpu_check.sh" --dry-run "$DEST" \
    || die "the CPU dry run failed (log: $DRY_OUT/gpu_check.log)"
  log "dry run passed: $DRY_OUT/summary.json"
fi
log "done: carry $(realpath --relative-to="$REPO" "$DEST" 2>/dev/null || echo "$DEST") to the GPU machine and run scripts/gpu_check.sh there"
