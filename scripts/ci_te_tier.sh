#!/usr/bin/env bash
# CI's TE tier: install Transformer Engine on this (CPU) machine, then run every test marked `te`.
# TE_ASSEMBLY_REQUIRE_TE=1 turns "TE does not import" into a failure instead of a skip.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install_te_cpu.sh
TE_ASSEMBLY_REQUIRE_TE=1 python -m pytest -m te -q -p no:cacheprovider tests "$@"
