"""``explain``: the resolved plan as tables."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console

from te_assembly.cli.commands.common import require_plan
from te_assembly.cli.report import plan_tables


def main(overrides: Sequence[str], console: Console) -> int:
    _, plan = require_plan(overrides, console)
    for table in plan_tables(plan):
        console.print(table)
    return 0
