"""What every command does first: take the analysis's plan, or fail with all its diagnostics."""

from __future__ import annotations

from rich.console import Console

from te_assembly.analysis.analyze import Analysis
from te_assembly.analysis.plan import Plan


def checked_plan(analysis: Analysis, console: Console) -> Plan:
    """The plan; raises ``ConfigError`` (exit 2) with every diagnostic when anything is an error, and
    prints the warnings otherwise."""
    plan = analysis.checked_plan()
    if analysis.warnings:
        from te_assembly.cli.report import print_diagnostics

        print_diagnostics(analysis.warnings, console)
    return plan
