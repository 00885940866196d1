"""``train``: the ``train`` job (``jobs/train/``) with a progress bar and its lines. Each run has its own
directory, by default ``outputs/<model>/<date>_<time>/`` (this job's Hydra run directory;
``jobs/train/run_dir.py`` decides, ``train.resume`` may name another)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from te_assembly.analysis.analyze import COMMON_SECTIONS, Analysis
from te_assembly.cli import job_dir
from te_assembly.cli.commands.session import Session, start
from te_assembly.data.settings import DataSettings
from te_assembly.diagnostics import printable
from te_assembly.engines.target import Target
from te_assembly.jobs.events import Advanced
from te_assembly.jobs.train.job import train
from te_assembly.jobs.train.result import Started, StepRecord, Stopped, TrainResult
from te_assembly.jobs.train.run_dir import RunPlace
from te_assembly.jobs.train.settings import TrainSettings
from te_assembly.views.training import evaluation_line, kept_lines, result_lines, run_lines, step_line

SECTIONS = {**COMMON_SECTIONS, "train": TrainSettings, "data": DataSettings}
RUN_DIR = True
COLUMNS = (
    TextColumn("{task.description}"),
    BarColumn(),
    MofNCompleteColumn(),
    TextColumn("loss {task.fields[loss]}"),
    TextColumn("{task.fields[tps]} tok/s"),
    TimeElapsedColumn(),
)


def main(analysis: Analysis, console: Console) -> int:
    session = start(analysis, console)
    settings: TrainSettings = session.section("train").for_task(session.plan.takes_token_ids)
    with session.distributed("train", ("train.batch_tokens", settings.tokens), settings.seq_len) as target:
        return _train(session, settings, console, target)


def _place() -> RunPlace:
    job = job_dir.current("train")
    return RunPlace(job.path, lambda: job_dir.claim(job), not job.default, job.runs_root, job.model)


def _train(session: Session, settings: TrainSettings, console: Console, target: Target) -> int:
    plan, data = session.plan, session.section("data")
    # shown once the lines that say what runs are out; a log (no terminal) gets step_line's instead
    progress = Progress(*COLUMNS, console=console, disable=not console.is_terminal)
    bar = progress.add_task("train", total=settings.steps, loss="-", tps="-")
    tokenizing: list[Any] = []

    def on_event(event: object) -> None:
        if isinstance(event, Started):
            _say(run_lines(plan, settings, target, data, event), console)
            progress.start()
        elif isinstance(event, Advanced) and event.task == "tokenize" and event.total > 1 << 20:
            if not tokenizing:  # a bar only for a corpus big enough to take a while
                tokenizing.append(progress.add_task("tokenize", total=event.total, loss="-", tps="-"))
            progress.update(tokenizing[0], completed=event.done)
        elif isinstance(event, StepRecord):
            loss, tps = f"{event.loss:.4g}", f"{event.tokens_per_s:,.0f}"
            progress.update(bar, completed=event.step, loss=loss, tps=tps)
            if not console.is_terminal and (event.step % settings.log_every == 0 or event.step == event.end):
                console.print(step_line(event), markup=False, soft_wrap=True)  # a log file's bar
            if event.evaluation is not None:
                progress.console.print(evaluation_line(event.step, event.evaluation), markup=False)
        elif isinstance(event, Stopped):
            progress.stop()
            _say(kept_lines(event, job_dir.current("train").overrides), console)

    config = session.analysis.resolved.as_config()
    try:
        result = train(plan, target, settings, data=data, config=config, place=_place(), on_event=on_event)
    finally:
        progress.stop()
    _report(result, console)
    return 0


def _say(lines: list[str], console: Console, style: str | None = None) -> None:
    for line in lines:
        console.print(printable(line), style=style, markup=False, soft_wrap=True)


def _report(result: TrainResult, console: Console) -> None:
    _say(result.notes, console, "yellow")
    _say(result_lines(result), console)
