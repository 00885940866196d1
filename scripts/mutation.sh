#!/usr/bin/env bash
# Mutation testing with mutmut: plant small bugs (mutants) in the core packages one at a time and check
# that some test fails for each. Not part of CI (.ci/run); run it when you change core code or its tests.
#
#   bash scripts/mutation.sh [SUBSET]
#
# SUBSET (default: core):
#   core        the reference ops and verify's comparison rules (compare, tolerance class, weight copy):
#               the math both engines are held to, and the judge itself. 843 mutants in 998 s measured
#               on the 2-core machine shared with other jobs (docs/mutation-survivors.md)
#   reference   te_assembly/engines/reference/ops/*        verify      all of te_assembly/jobs/verify.py (longer: its
#                                                              end-to-end tests build models per mutant)
#   checkpoint  te_assembly/formats/checkpoint.py    validate    te_assembly/analysis/*
#   engines     te_assembly/engines/*              all         every core package (hours)
# The test selection in pyproject's [tool.mutmut] is sized for core and verify; widen it first for the
# others (tests/validation for validate; tests/engines for engines; tests/tools/test_train.py and
# tests/tools/test_train_resume_dropout.py for checkpoint).
#
# Needs the [mutation] extra (pip install -e '.[mutation]'). The te and gpu tiers take no part (pyproject's
# pytest_add_cli_args): TE model builds would make a run take hours; the survivors file notes the
# mutants only they kill.
# Writes mutants/ (git-ignored) and mutants/survivors.md (each survivor with the line it changed);
# `mutmut show NAME` shows one in full. docs/mutation-survivors.md is where the team triages them: kill
# each with a test, or explain why it cannot be killed. MUTATION_KEEP=1 reuses mutants/ and its results.
set -euo pipefail
cd "$(dirname "$0")/.."

subset="${1:-core}"
case "$subset" in
  core)
    names=("te_assembly.engines.reference.ops.*")
    for f in compare precision_class _loss_dtype copy_weights state_dict_parameters fill_zero_parameters; do
      names+=("te_assembly.jobs.verify.x_${f}__mutmut_*")
    done
    ;;
  reference) names=("te_assembly.engines.reference.ops.*") ;;
  verify) names=("te_assembly.jobs.verify.*") ;;
  checkpoint) names=("te_assembly.formats.checkpoint.*") ;;
  validate) names=("te_assembly.analysis.*") ;;
  engines) names=("te_assembly.engines.*") ;;
  all) names=() ;;
  *) echo "unknown subset '$subset' (core, reference, verify, checkpoint, validate, engines, all)" >&2; exit 2 ;;
esac

if ! command -v mutmut >/dev/null; then
  echo "mutmut is not installed: pip install -e '.[mutation]'" >&2
  exit 2
fi
[[ "${MUTATION_KEEP:-0}" == 1 ]] || rm -rf mutants
# The test suite's CI profile: hypothesis replays fixed examples, so a mutant's verdict is repeatable.
export CI=1
start=$SECONDS
mutmut run --max-children "${MUTATION_CHILDREN:-$(nproc)}" "${names[@]}"
elapsed=$((SECONDS - start))
python scripts/mutation_survivors.py > mutants/survivors.md
echo
echo "subset $subset: ${elapsed} s; $(head -1 mutants/survivors.md | tr -d '#'), each with its change in mutants/survivors.md"
