#!/usr/bin/env bash
# The GPU check, written for the device tool's limits: one command of at most 600 s (default budget 510 s,
# so a run with `timeout_s` 540 ends on its own), a machine with torch but neither Transformer Engine nor
# internet, and at most 8 files coming back from $OUT.
#
#   scripts/gpu_check.sh [--dry-run] [--force] BUNDLE_DIR      (BUNDLE_DIR from scripts/prepare_gpu_bundle.sh)
#
# Steps (each with its own time limit, cut to what the budget leaves; a failing step never stops the ones
# after it, so the bench runs even when a test fails):
#   facts    Python, torch, CUDA, the GPU (exits early without one)                        ~5 s
#   install  TE from the bundle into $STATE/site (on PYTHONPATH): the prebuilt extension
#            wheel; if it does not import, compiled here from its source (the built wheel
#            and build log come back in $OUT)                                               ~20 s (build: ~4 min)
#   sanity   te.Linear/LayerNorm/RMSNorm/ops and each FP8 recipe against torch
#            (scripts/gpu_sanity.py), with CUDA_MODULE_LOADING=EAGER: a kernel missing
#            from the slimmed library fails here, at once                                  ~30 s
#   pytest   the gpu tier: pytest -m gpu tests with TE_ASSEMBLY_REQUIRE_TE=1 and
#            TE_ASSEMBLY_REQUIRE_GPU=1 (a skip for missing TE or GPU becomes a failure); with
#            tests/te/test_gpu_language.py: KV-cache generation in the TE engine, eval, an
#            instruction fine-tuning run with TE's fused cross-entropy under fp8_delayed     ~90 s
#   verify   verify of the shipped models under bf16, float32 (TF32) and every recipe;
#            MXFP8/NVFP4 are reported unsupported on sm_90 (scripts/gpu_report.py)          ~60 s
#   bench    TE engine step times, tokens/s and TFLOP/s (scripts/gpu_report.py)             ~60 s
#   summary  $OUT/summary.json: every step's status and seconds, verify per recipe, bench numbers
#
# Resumable: each finished step leaves a marker in $STATE keyed by the code under test and the bundle, and
# a rerun on a still-warm machine skips it (reprinting its log); a step the budget cut is run by the next
# call. --force reruns everything. $OUT gets: gpu_check.log, summary.json, pytest-gpu.xml (+ on a fallback
# build: build_extension.log and the wheel). Exit: 0 all passed, 1 something failed, 75 steps left for a
# rerun (none failed).
#
# --dry-run (CPU): the same steps up to the first CUDA call: checks the bundle's checksums, installs it
# when this Python matches the bundle's (prepare_gpu_bundle.sh runs it that way) and imports TE, collects
# the gpu tier, composes and validates every verify and bench configuration.
#
# Environment: OUT (./gpu_check_out), GPU_CHECK_STATE (/tmp/te_assembly_gpu_check; a fresh temporary
# folder for --dry-run), PYTHON (python3), GPU_CHECK_BUDGET_S (510), CUDA_HOME (/usr/local/cuda).
set -uo pipefail

DRY_RUN=0
FORCE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1; shift;;
    --force) FORCE=1; shift;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0;;
    -*) echo "unknown option $1" >&2; exit 2;;
    *) break;;
  esac
done
if [ $# -ne 1 ] || [ ! -d "$1" ]; then
  echo "usage: $0 [--dry-run] [--force] BUNDLE_DIR   (make it with scripts/prepare_gpu_bundle.sh)" >&2
  exit 2
fi
BUNDLE=$(cd "$1" && pwd)
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO" || exit 2
OUT_DIR=${OUT:-$REPO/gpu_check_out}
mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd)
if [ "$DRY_RUN" = 1 ]; then
  STATE=${GPU_CHECK_STATE:-$(mktemp -d)}
else
  STATE=${GPU_CHECK_STATE:-/tmp/te_assembly_gpu_check}
fi
mkdir -p "$STATE/logs" "$STATE/done"
exec > >(tee -a "$OUT_DIR/gpu_check.log") 2>&1

PY=${PYTHON:-python3}
BUDGET=${GPU_CHECK_BUDGET_S:-510}
DEADLINE=$((SECONDS + BUDGET))
T0=$(date +%s)
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INDEX=1
SITE="$STATE/site"
export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
# Only the sanity step loads every kernel module up front (CUDA_MODULE_LOADING=EAGER); elsewhere CUDA's
# lazy loading keeps start-up fast.
unset CUDA_MODULE_LOADING

log() { echo "[gpu_check +$(( $(date +%s) - T0 ))s] $*"; }
log "repo $REPO, bundle $BUNDLE, out $OUT_DIR, state $STATE, python $PY, budget ${BUDGET}s$([ "$DRY_RUN" = 1 ] && echo ', DRY RUN')"

# --- the bundle: complete and unchanged? ------------------------------------------------------------
[ -f "$BUNDLE/MANIFEST.sha256" ] || { log "FAILED: $BUNDLE has no MANIFEST.sha256 (not a prepare_gpu_bundle.sh bundle)"; exit 1; }
if ! (cd "$BUNDLE" && sha256sum --quiet -c MANIFEST.sha256); then
  log "FAILED: the bundle's files do not match MANIFEST.sha256 (incomplete copy?)"
  exit 1
fi
BUNDLE_KEY=$(sha256sum "$BUNDLE/MANIFEST.sha256" | cut -c1-16)
TREE_KEY=$(find te_assembly tests scripts configs recipes pyproject.toml -type f ! -name '*.pyc' \
  ! -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
KEY="$TREE_KEY-$BUNDLE_KEY"
RESULTS="$STATE/results/$KEY"
mkdir -p "$RESULTS"
: > "$RESULTS/steps.tsv"

FAILED=0
INCOMPLETE=0
remaining() { echo $((DEADLINE - SECONDS)); }

# run_step NAME MAX_S MIN_S RESERVE_S CMD...: run CMD under a time limit of MAX_S, cut so that RESERVE_S
# stay for the steps after it; skipped (left for a rerun) when less than MIN_S is left. A step finished
# under the same code and bundle is not rerun (unless --force or --dry-run).
run_step() {
  local name=$1 max=$2 min=$3 reserve=$4
  shift 4
  local marker="$STATE/done/$name-$KEY" limit rc start status
  if [ "$DRY_RUN" = 0 ] && [ "$FORCE" = 0 ] && [ -f "$marker" ]; then
    rc=$(cat "$marker")
    log "== $name: done earlier with this code and bundle (exit $rc); its log follows"
    cat "$STATE/logs/$name.log" 2>/dev/null
    status=$([ "$rc" = 0 ] && echo passed || echo failed)
    printf '%s\t%s\t0\tearlier run\n' "$name" "$status" >> "$RESULTS/steps.tsv"
    [ "$rc" = 0 ] || FAILED=1
    return 0
  fi
  limit=$(( $(remaining) - reserve ))
  [ "$limit" -gt "$max" ] && limit=$max
  if [ "$limit" -lt "$min" ]; then
    log "== $name: not run, only ${limit}s of the budget left for it (needs ${min}s); run the same command again to continue"
    printf '%s\tskipped\t0\tout of time budget\n' "$name" >> "$RESULTS/steps.tsv"
    INCOMPLETE=1
    return 0
  fi
  log "== $name (limit ${limit}s)"
  start=$SECONDS
  # The step is a function of this script: run it in a child bash that timeout can stop (with every
  # process under it); STEP_LIMIT tells it its own limit.
  STEP_LIMIT=$limit timeout --kill-after=10 "$limit" bash -c '"$@"' _ "$@" 2>&1 | tee "$STATE/logs/$name.log"
  rc=${PIPESTATUS[0]}
  case $rc in
    0) status=passed;;
    124|137) status=timeout; FAILED=1;;
    *) status=failed; FAILED=1;;
  esac
  log "== $name: $status (exit $rc, $((SECONDS - start))s)"
  printf '%s\t%s\t%s\t\n' "$name" "$status" "$((SECONDS - start))" >> "$RESULTS/steps.tsv"
  [ "$DRY_RUN" = 0 ] && [ "$status" != timeout ] && echo "$rc" > "$marker"
  return 0
}

step_facts() {
  "$PY" scripts/gpu_report.py facts --json "$RESULTS/facts.json" $([ "$DRY_RUN" = 1 ] && echo --dry-run) || return 1
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  return 0
}

# --- install --------------------------------------------------------------------------------------
te_imports() {  # te_imports [JSON_FILE EXTENSION_NOTE]: import TE; record its version and where it came from
  "$PY" - "$@" <<'PYEOF'
import json, sys

import torch  # before transformer_engine: TE's core library needs torch's libnccl
import transformer_engine
import transformer_engine.pytorch  # noqa: F401  the extension and the core library load here

print("transformer_engine", transformer_engine.__version__, "from", transformer_engine.__file__)
if len(sys.argv) > 2:
    json.dump({"transformer_engine": transformer_engine.__version__, "location": transformer_engine.__file__,
               "torch": torch.__version__, "extension": sys.argv[2]}, open(sys.argv[1], "w"), indent=2)
PYEOF
}

missing_deps() {
  # The carried wheels whose distribution this Python lacks, or has at a lower version.
  "$PY" - "$BUNDLE/deps" "$SITE" <<'PYEOF'
import sys
from importlib import metadata
from pathlib import Path

from packaging.version import Version

site = sys.argv[2]
sys.path[:] = [p for p in sys.path if not p.startswith(site)]  # judge the image, not our own install
for wheel in sorted(Path(sys.argv[1]).glob("*.whl")):
    name, version = wheel.name.split("-")[:2]
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        print(wheel)
        continue
    if Version(have) < Version(version):
        print(wheel)
PYEOF
}

install_into_site() {  # install_into_site EXTENSION_WHEEL: everything in one pip call (see below)
  local ext=$1 deps
  rm -rf "$SITE" && mkdir -p "$SITE"
  mapfile -t deps < <(missing_deps)
  log "carried packages this image lacks: ${#deps[@]} ($(for d in "${deps[@]}"; do basename "$d" | cut -d- -f1-2; done | tr '\n' ' '))"
  # One call: with --target a later call would replace, not merge, the transformer_engine folder that the
  # Python, core and extension wheels share.
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" \
    "$BUNDLE"/te/transformer_engine-*-py3-none-any.whl "$BUNDLE"/te/transformer_engine_cu13-*.whl "$ext" \
    "${deps[@]}" || return 1
  mkdir -p "$SITE/transformer_engine/wheel_lib"
  # Python's lzma, not the xz tool: the GPU image is not promised to have xz.
  "$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"), 1 << 24)' \
    "$(ls "$BUNDLE"/te/libtransformer_engine.sm*.so.xz)" "$SITE/transformer_engine/wheel_lib/libtransformer_engine.so" \
    || return 1
}

build_extension() {  # compile the extension here from its source; the wheel also goes back in $OUT
  local limit=$1 sp wheels="$STATE/wheels"
  rm -rf "$wheels" "$STATE/cudnn" && mkdir -p "$wheels" "$STATE/cudnn"
  "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2], filter="data")' \
    "$BUNDLE/te/cudnn_frontend_include.tar.xz" "$STATE/cudnn" >&2 || return 1
  sp=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  log "compiling transformer_engine_torch with MAX_JOBS=$(nproc), at most ${limit}s (log: build_extension.log)" >&2
  NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_BUILD_USE_NVIDIA_WHEELS=1 MAX_JOBS=$(nproc) \
  CPLUS_INCLUDE_PATH="$STATE/cudnn/include:$sp/include:$CUDA_HOME/include${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}" \
    timeout "$limit" "$PY" -m pip wheel --no-index --no-deps --no-build-isolation -w "$wheels" \
    "$BUNDLE"/te/transformer_engine_torch-*.tar.gz > "$OUT_DIR/build_extension.log" 2>&1 \
    || { tail -n 30 "$OUT_DIR/build_extension.log" >&2; return 1; }
  cp "$wheels"/transformer_engine_torch-*.whl "$OUT_DIR"/ >&2
  ls "$wheels"/transformer_engine_torch-*.whl
}

step_install() {
  local marker="$SITE/.installed-$BUNDLE_KEY" tag bundle_tag ext
  if [ -f "$marker" ] && te_imports "$RESULTS/install.json" "$(cat "$marker")"; then
    log "TE already installed from this bundle in $SITE"
    return 0
  fi
  tag=$("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  bundle_tag=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["python_tag"])' "$BUNDLE/bundle.json")
  if [ "$tag" != "$bundle_tag" ]; then
    if [ "$DRY_RUN" = 1 ]; then
      log "dry run: not installing, the bundle is for $bundle_tag and this Python is $tag"
      return 0
    fi
    log "the bundle's prebuilt extension is for $bundle_tag, this Python is $tag: building it here"
  fi
  ext=$(ls "$BUNDLE"/te/transformer_engine_torch-*-"$tag"-*.whl 2>/dev/null | head -n 1)
  if [ -n "$ext" ]; then
    install_into_site "$ext" || return 1
    if te_imports "$RESULTS/install.json" "prebuilt (carried in the bundle)"; then
      echo "prebuilt (carried in the bundle)" > "$marker"
      return 0
    fi
    log "the prebuilt extension does not import here (above): building it from source"
  fi
  [ "$DRY_RUN" = 1 ] && { log "dry run: no fallback build"; return 1; }
  ext=$(build_extension $(( STEP_LIMIT - SECONDS - 40 ))) || return 1
  install_into_site "$ext" || return 1
  te_imports "$RESULTS/install.json" "built on this machine (the wheel is in \$OUT)" || return 1
  echo "built on this machine (the wheel is in \$OUT)" > "$marker"
}

step_sanity() {
  if [ "$DRY_RUN" = 1 ]; then
    "$PY" scripts/gpu_sanity.py check --dry-run --json "$RESULTS/sanity.json"
  else
    CUDA_MODULE_LOADING=EAGER "$PY" scripts/gpu_sanity.py check --json "$RESULTS/sanity.json"
  fi
}

step_pytest() {
  if [ "$DRY_RUN" = 1 ]; then
    # Collection only: which gpu tests would run (test_cuda_matches_cpu and the recipe tests among them).
    "$PY" -m pytest -m gpu --collect-only -q -p no:cacheprovider tests | tee "$RESULTS/pytest-collect.txt"
    return "${PIPESTATUS[0]}"
  fi
  TE_ASSEMBLY_REQUIRE_TE=1 TE_ASSEMBLY_REQUIRE_GPU=1 "$PY" -m pytest -m gpu -q -p no:cacheprovider -rfEs \
    --junitxml "$RESULTS/pytest-gpu.xml" tests
}

step_report() {  # step_report verify|bench
  "$PY" scripts/gpu_report.py "$1" --json "$RESULTS/$1.json" $([ "$DRY_RUN" = 1 ] && echo --dry-run)
}

export -f log te_imports missing_deps install_into_site build_extension step_facts step_install step_sanity \
  step_pytest step_report
export PY REPO BUNDLE SITE STATE RESULTS OUT_DIR DRY_RUN BUNDLE_KEY T0

# name max min reserve: the reserve keeps the later steps' minimums free (sanity 30, pytest 60, verify
# 40, bench 30), so a slow step cannot starve the bench.
run_step facts 60 10 160 step_facts
if grep -q $'^facts\tfailed' "$RESULTS/steps.tsv" && [ "$DRY_RUN" = 0 ]; then
  log "FAILED: this machine cannot run the check (see facts above)"
  "$PY" scripts/gpu_report.py summary --state "$RESULTS" --out "$OUT_DIR/summary.json"
  exit 1
fi
run_step install 420 20 160 step_install
if grep -q $'^install\tpassed' "$RESULTS/steps.tsv" || [ "$DRY_RUN" = 1 ]; then
  run_step sanity 90 30 130 step_sanity
  run_step pytest 170 60 70 step_pytest
  run_step verify 130 40 30 step_report verify
  run_step bench 100 30 0 step_report bench
elif grep -q $'^install\tskipped' "$RESULTS/steps.tsv"; then
  log "TE is not installed yet (no time left for it): rerun to continue"
  INCOMPLETE=1
else
  log "TE is not installed: sanity, pytest, verify and bench cannot run"
  FAILED=1
fi
cp "$RESULTS/pytest-gpu.xml" "$OUT_DIR/" 2>/dev/null  # also when the pytest step ran in an earlier call
"$PY" scripts/gpu_report.py summary --state "$RESULTS" --out "$OUT_DIR/summary.json"
log "summary: $OUT_DIR/summary.json"
column -t -s $'\t' "$RESULTS/steps.tsv" 2>/dev/null || cat "$RESULTS/steps.tsv"
if [ "$FAILED" = 1 ]; then
  log "FAILED: see the failing steps above"
  exit 1
fi
if [ "$INCOMPLETE" = 1 ]; then
  log "INCOMPLETE: some steps did not fit the budget; run the same command again to finish them"
  exit 75
fi
log "all steps passed$([ "$DRY_RUN" = 1 ] && echo ' (dry run: nothing ran on a GPU)')"
exit 0
