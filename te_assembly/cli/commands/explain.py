"""``explain``: the resolved plan as tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from te_assembly.cli.commands.common import require_plan, section
from te_assembly.cli.report import plan_tables
from te_assembly.plan import Plan


def main(overrides: Sequence[str], console: Console) -> int:
    loaded, plan = require_plan(overrides, console)
    for table in plan_tables(plan):
        console.print(table)
    for table in parallel_tables(plan, section(loaded.cfg, "parallel")):
        console.print(table)
    return 0


def parallel_tables(plan: Plan, raw: dict[str, Any]) -> list[Table]:
    """Each rank's local shapes and parameter counts, when the ``parallel`` sizes split the model."""
    from te_assembly.parallel.checks import parallel_diagnostics
    from te_assembly.parallel.report import layout_tables

    layout, _ = parallel_diagnostics(raw, plan)
    return layout_tables(plan, layout) if layout is not None and layout.settings.is_parallel else []
