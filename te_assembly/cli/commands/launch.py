"""``launch``: check a parallel job for ``launch.nodes`` x ``launch.gpus_per_node`` ranks before any machine
is used (everything ``validate`` checks of the layout, the world size, the memory of the fullest rank on
one ``launch.accelerator``), then write the script that starts it on ``launch.scheduler`` into the run
directory (``analysis/parallel/scripts.py``) and say how to submit it."""

from __future__ import annotations

import shlex
from pathlib import Path

from rich.console import Console

from te_assembly.analysis.analyze import DEFAULT_SECTIONS, PARALLEL, Analysis
from te_assembly.analysis.parallel.scripts import LaunchSettings, job_arguments, render
from te_assembly.analysis.parallel.settings import ParallelSettings
from te_assembly.catalog.devices import ACCELERATORS
from te_assembly.cli import job_dir
from te_assembly.cli.commands import Outcome
from te_assembly.cli.commands.common import checked_plan
from te_assembly.diagnostics import Diagnostic, error, printable
from te_assembly.errors import ConfigError
from te_assembly.files.write import write_text_atomic
from te_assembly.jobs.train.settings import TrainSettings

SECTIONS = {**DEFAULT_SECTIONS, "train": TrainSettings, "launch": LaunchSettings}
RUN_DIR = True


def main(analysis: Analysis, console: Console) -> Outcome:
    checked_plan(analysis, console)
    launch: LaunchSettings = analysis.section("launch")
    parallel: ParallelSettings = analysis.section(PARALLEL)
    problems = _world_size(launch, parallel)
    memory = None
    if not problems:
        memory, problem = _memory(analysis, launch)
        problems += problem
    if problems:
        raise ConfigError([*analysis.diagnostics, *problems])
    resolved = analysis.resolved
    arguments = job_arguments(launch.job, resolved.overrides, resolved.config_dirs, launch.name)
    job = job_dir.current("launch")
    written_by = job_dir.command_line(job) or "python -m te_assembly launch"
    script = render(launch, arguments, written_by, str(Path.cwd()))
    out = job_dir.claim(job)
    job_dir.write_config(out, resolved.as_config(), job)
    path = write_text_atomic(out / script.file, script.text)
    console.print(
        f"{launch.nodes} node(s) x {launch.gpus_per_node} = {launch.world_size} ranks: {parallel.describe()}",
        markup=False,
        soft_wrap=True,
    )
    if memory is not None:
        console.print(memory, markup=False, soft_wrap=True)
    console.print(f"wrote {printable(str(path))}", markup=False, soft_wrap=True)
    submit = (
        f"{script.submit} {shlex.quote(str(path))}"
        if script.submit.startswith(("sbatch", "sky"))
        else script.submit
    )
    console.print(f"next: {printable(submit)}", markup=False, soft_wrap=True)
    return Outcome(0, {"ranks": launch.world_size, "script": str(path)})


def _world_size(launch: LaunchSettings, parallel: ParallelSettings) -> list[Diagnostic]:
    """The ranks the machines give must be the ranks the layout needs."""
    if launch.world_size == parallel.world_size:
        return []
    rest = parallel.world_size // parallel.data
    hint = (
        f"parallel.data={launch.world_size // rest} uses them all"
        if launch.world_size % rest == 0
        else f"launch.nodes x launch.gpus_per_node = {parallel.world_size}"
    )
    return [
        error(
            "launch.nodes",
            "launch-world-size",
            f"launch.nodes={launch.nodes} x launch.gpus_per_node={launch.gpus_per_node} = "
            f"{launch.world_size} ranks, but the layout is {parallel.describe()}",
            hint,
        )
    ]


def _memory(analysis: Analysis, launch: LaunchSettings) -> tuple[str | None, list[Diagnostic]]:
    """The fullest rank's memory in words, against one ``launch.accelerator`` (none: not checked)."""
    from te_assembly.engines.memory import format_bytes
    from te_assembly.testing.checks import rank_needs

    if launch.accelerator is None:
        return None, []
    device = ACCELERATORS[launch.accelerator]
    needed, words = rank_needs(analysis)
    held = f"one {device.name} holds {format_bytes(device.memory_bytes)}"
    if needed <= device.memory_bytes:
        return f"{words}: fits ({held})", []
    return None, [
        error(
            "launch.accelerator",
            "launch-does-not-fit",
            f"{words}, but {held}",
            "more ranks for the weights (parallel.shard, parallel.tensor, parallel.expert), a smaller "
            "train.batch_tokens, or a larger accelerator",
        )
    ]
