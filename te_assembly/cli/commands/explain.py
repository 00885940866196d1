"""``explain``: the resolved plan as tables (and, under parallel sizes, each rank's slices). Block steps
are collapsed to one row per run of uses unless ``explain.expand`` names them (``all``, ``layers``,
``layers.3``)."""

from __future__ import annotations

from rich.console import Console

from te_assembly.cli.commands.common import checked_plan
from te_assembly.cli.report import plan_tables
from te_assembly.errors import ConfigError
from te_assembly.outline import ExplainSettings, parse_expand
from te_assembly.validate.analysis import COMMON_SECTIONS, Analysis

SECTIONS = {**COMMON_SECTIONS, "explain": ExplainSettings}


def main(analysis: Analysis, console: Console) -> int:
    plan = checked_plan(analysis, console)
    settings: ExplainSettings = analysis.section("explain")
    expand, problems = parse_expand(settings.expand, plan.blocks, "explain.expand")
    if problems:
        raise ConfigError(problems)
    for table in plan_tables(plan, expand):
        console.print(table)
    layout = analysis.layout
    if layout is not None and layout.settings.is_parallel:
        # Each rank's local shapes and parameter counts, when the ``parallel`` sizes split the model.
        from te_assembly.parallel.report import layout_tables

        for table in layout_tables(plan, layout):
            console.print(table)
    return 0
