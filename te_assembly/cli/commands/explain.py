"""``explain``: the resolved plan as tables (and, under parallel sizes, each rank's slices). Block steps
are collapsed to one row per run of uses unless ``explain.expand`` names them (``all``, ``layers``,
``layers.3``)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from te_assembly.cli.commands.common import checked_plan
from te_assembly.cli.report import plan_tables
from te_assembly.errors import ConfigError
from te_assembly.outline import Expand, ExplainSettings, parse_expand
from te_assembly.parallel.layout import ShardPlan
from te_assembly.plan import Plan
from te_assembly.validate.analysis import COMMON_SECTIONS, Analysis

SECTIONS = {**COMMON_SECTIONS, "explain": ExplainSettings}


def tables(plan: Plan, layout: ShardPlan | None = None, expand: Expand | None = None) -> list[Table]:
    """What ``explain`` prints, and ``model.summary()`` returns as text: the plan's tables (block steps
    collapsed unless ``expand`` names them) and, when the ``parallel`` sizes split the model, each rank's
    local shapes and parameter counts."""
    out = plan_tables(plan, expand)
    if layout is not None and layout.settings.is_parallel:
        from te_assembly.parallel.report import layout_tables

        out.extend(layout_tables(plan, layout))
    return out


def main(analysis: Analysis, console: Console) -> int:
    plan = checked_plan(analysis, console)
    settings: ExplainSettings = analysis.section("explain")
    expand, problems = parse_expand(settings.expand, plan.blocks, "explain.expand")
    if problems:
        raise ConfigError(problems)
    for table in tables(plan, analysis.layout, expand):
        console.print(table)
    return 0
