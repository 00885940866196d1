"""``validate``: exit 0 with a summary, or 2 with every diagnostic (model, recipe and run settings)."""

from __future__ import annotations

from rich.console import Console

from te_assembly.analysis.analyze import DEFAULT_SECTIONS, PARALLEL, Analysis
from te_assembly.analysis.fusions import FusionSettings
from te_assembly.analysis.parallel.settings import ParallelSettings
from te_assembly.analysis.plan import Plan
from te_assembly.cli.commands import Outcome
from te_assembly.cli.commands.common import checked_plan
from te_assembly.data.settings import DataSettings
from te_assembly.diagnostics import printable
from te_assembly.errors import ConfigError
from te_assembly.jobs.bench.settings import BenchSettings
from te_assembly.jobs.generate.settings import GenerateSettings
from te_assembly.jobs.train.settings import TrainSettings
from te_assembly.views.graph import GraphSettings
from te_assembly.views.outline import ExplainSettings, parse_expand

SECTIONS = {
    **DEFAULT_SECTIONS,
    "train": TrainSettings,
    "bench": BenchSettings,
    "graph": GraphSettings,
    "explain": ExplainSettings,
    "data": DataSettings,
    "generate": GenerateSettings,
    "fusions": FusionSettings,
}
"""Every section a later command reads: a mistake in ``train:`` fails here, not after a build."""


def main(analysis: Analysis, console: Console) -> Outcome:
    plan = checked_plan(analysis, console)
    problems = [  # names only the plan can judge: the block steps to expand
        d
        for section in ("explain", "graph")
        for d in parse_expand(analysis.section(section).expand, plan.blocks, f"{section}.expand")[1]
    ]
    if problems:
        raise ConfigError(problems)
    file = analysis.resolved.file_of("model")
    where = f" ({printable(file)})" if file else ""
    summary = {
        "steps": len(plan.steps),
        "fusers": len(plan.fusers),
        "channels": len(plan.channels),
        "public inputs": len(plan.public_inputs),
        "public outputs": len(plan.public_outputs),
        "warnings": len(analysis.warnings),
        "rerouted channels": len(plan.reroutes),
    }
    console.print(
        f"{printable(plan.name)}{where}: valid — {len(plan.steps)} steps, {len(plan.fusers)} fuser(s), "
        f"{len(plan.channels)} channel(s), {len(plan.public_inputs)} public input(s), "
        f"{len(plan.public_outputs)} public output(s), {len(analysis.warnings)} warning(s)",
        markup=False,
        soft_wrap=True,
    )
    if plan.reroutes:
        console.print(reroute_summary(plan), markup=False, soft_wrap=True)
    parallel: ParallelSettings = analysis.section(PARALLEL)
    if parallel.is_parallel:
        from te_assembly.analysis.parallel.launch import torchrun_command

        launch = torchrun_command(parallel.world_size)
        console.print(f"parallel: {parallel.describe()}; launch {launch}", markup=False)
    return Outcome(0, summary)


def reroute_summary(plan: Plan, shown: int = 3) -> str:
    """One line: the channels read across modules (carried between fusers by the engine), the first few
    with the fusers and modules they cross."""
    names = {s.index: s.name for s in plan.steps}
    listed = "; ".join(
        f"{r.channel} (fuser {r.producer_fuser} -> {', '.join(map(str, r.consumer_fusers))}, across "
        f"{', '.join(names[m] for m in r.crosses)})"
        for r in plan.reroutes[:shown]
    )
    more = f"; and {len(plan.reroutes) - shown} more" if len(plan.reroutes) > shown else ""
    return printable(f"rerouted across modules: {len(plan.reroutes)} channel(s): {listed}{more}")
