"""``explain``: the resolved plan as tables (and, under parallel sizes, each rank's slices). Block steps
are collapsed to one row per run of uses unless ``explain.expand`` names them (``all``, ``layers``,
``layers.3``)."""

from __future__ import annotations

from rich.console import Console

from te_assembly.analysis.analyze import COMMON, COMMON_SECTIONS, PARALLEL, Analysis
from te_assembly.analysis.fusions import FusionSettings, FusionTarget
from te_assembly.cli.commands.common import checked_plan
from te_assembly.errors import ConfigError
from te_assembly.views.explain import tables
from te_assembly.views.outline import ExplainSettings, parse_expand

SECTIONS = {**COMMON_SECTIONS, "explain": ExplainSettings, "fusions": FusionSettings}


def main(analysis: Analysis, console: Console) -> int:
    plan = checked_plan(analysis, console)
    settings: ExplainSettings = analysis.section("explain")
    expand, problems = parse_expand(settings.expand, plan.blocks, "explain.expand")
    if problems:
        raise ConfigError(problems)
    fusions: FusionSettings = analysis.section("fusions")
    common = analysis.section(COMMON)
    target = FusionTarget.of(
        fusions.target,
        recipe=analysis.recipe,
        dtype=common.dtype,
        kernels=common.kernels,
        tensor_parallel=analysis.section(PARALLEL).tensor,
    )
    for table in tables(plan, analysis.layout, expand, target):
        console.print(table)
    return 0
