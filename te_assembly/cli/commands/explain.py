"""``explain``: the resolved plan as tables."""

from __future__ import annotations

from rich.console import Console

from te_assembly.cli.commands.common import checked_plan
from te_assembly.cli.report import plan_tables
from te_assembly.validate.analysis import COMMON_SECTIONS, Analysis

SECTIONS = COMMON_SECTIONS


def main(analysis: Analysis, console: Console) -> int:
    plan = checked_plan(analysis, console)
    for table in plan_tables(plan):
        console.print(table)
    return 0
