"""``python -m te_assembly.jobs.harness``: the same as ``te-assembly-lm-eval``."""

from te_assembly.jobs.harness.cli import main

main()
