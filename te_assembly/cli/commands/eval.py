"""``eval SOURCE``: a language model's loss, perplexity and bits per byte on a text (``data.path``, the
default corpus when not given), with a progress bar (the job: ``jobs/eval/``); with ``eval.tasks``, its
scores on lm-evaluation-harness tasks instead (``jobs/harness/``). SOURCE (``eval.source``) is a run
directory, a checkpoint or a pretrained directory, an imported one included. Writes ``eval.json`` and the
resolved config into the run directory (``outputs/<source name>/<date>_<time>/``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from te_assembly.analysis.analyze import COMMON, COMMON_SECTIONS, Analysis
from te_assembly.analysis.settings import CommonSettings
from te_assembly.cli import job_dir
from te_assembly.data.settings import DataSettings
from te_assembly.diagnostics import error, printable
from te_assembly.engines.target import Target
from te_assembly.errors import ConfigError
from te_assembly.files.write import write_text_atomic
from te_assembly.jobs.eval.settings import EvalSettings
from te_assembly.jobs.events import Advanced

SECTIONS = {**COMMON_SECTIONS, "eval": EvalSettings, "data": DataSettings}
RUN_DIR = True


def main(analysis: Analysis, console: Console) -> int:
    settings: EvalSettings = analysis.section("eval")
    if settings.source is None:
        raise ConfigError(
            [
                error(
                    "eval.source",
                    "missing",
                    "eval needs a model to score: a run directory, a checkpoint or a pretrained directory",
                    "e.g. python -m te_assembly eval outputs/dense_lm/<date>_<time> data.path=notes/",
                )
            ]
        )
    common: CommonSettings = analysis.section(COMMON)
    job = job_dir.current("eval")
    job_dir.check_claimable(job)  # where it writes, before the model is loaded
    data: DataSettings = analysis.section("data")
    target = Target.from_settings(common, None)
    if settings.tasks:
        return _tasks(analysis, settings, target, job, console)
    return _perplexity(analysis, settings, data, target, job, console)


def _perplexity(
    analysis: Analysis,
    settings: EvalSettings,
    data: DataSettings,
    target: Target,
    job: job_dir.JobDir,
    console: Console,
) -> int:
    """The loss, perplexity and bits per byte on ``data``, with a progress bar, into ``eval.json``."""
    from te_assembly.data.chat import has_chat_template
    from te_assembly.jobs.eval.job import evaluate
    from te_assembly.jobs.generate.job import model_folder
    from te_assembly.jobs.window import DEFAULT, window

    assert settings.source is not None  # main refuses a missing one
    # Decided (and refused past the model's context) before the model loads.
    source = settings.source
    given = Path(source).expanduser()
    seq_len = window(settings.seq_len, given, "eval.seq_len", model_folder(given).name, at_most=DEFAULT)
    settings = dataclasses.replace(settings, seq_len=seq_len)
    where = data.path or "the default corpus"
    console.print(
        f"eval {printable(source)} on {printable(where)} ({settings.split}): windows of "
        f"{settings.seq_len}, stride {settings.stride or settings.seq_len}, {settings.batch} per forward",
        markup=False,
        soft_wrap=True,
    )
    if data.format != "chat" and has_chat_template(model_folder(given)):
        console.print(
            "note: the model has a chat template, and this scores it on raw text (data.format=text); "
            "data.format=chat scores the answers of JSON Lines conversations rendered with it",
            markup=False,
            soft_wrap=True,
        )
    bar, on_event = _progress(console)
    with bar:
        result = evaluate(source, target, data, settings, on_event=on_event)
    bpb = f"{result.bits_per_byte:.4f}" if result.bits_per_byte is not None else "n/a (bytes unknown)"
    console.print(
        f"loss {result.loss:.4f} nats/token, perplexity {result.perplexity:.3f}, bits per byte {bpb} "
        f"({result.tokens:,} tokens in {result.windows:,} windows)",
        markup=False,
    )
    out = job_dir.claim(job)
    job_dir.write_config(out, analysis.resolved.as_config(), job)
    written = write_text_atomic(out / "eval.json", json.dumps(result.as_json(), indent=1))
    console.print(f"wrote {printable(str(written))}", markup=False, soft_wrap=True)
    return 0


def _progress(console: Console) -> tuple[Progress, Callable[[object], None]]:
    """A bar of the windows scored, and what moves it (the job's ``Advanced`` events)."""
    bar = Progress(
        TextColumn("scoring"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("windows {task.description}"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )
    task = bar.add_task("", total=None)

    def on_event(event: object) -> None:
        if isinstance(event, Advanced) and event.task == "eval":
            bar.update(task, completed=event.done, total=event.total, description=event.description)

    return bar, on_event


def _tasks(
    analysis: Analysis, settings: EvalSettings, target: Target, job: job_dir.JobDir, console: Console
) -> int:
    """``eval.tasks``: lm-eval's tasks on the source, its table printed, its results in ``eval.json``."""
    from te_assembly.jobs.harness.run import evaluate_tasks, harness

    harness()  # the extra is there, before anything loads
    shown = ", ".join(settings.tasks)
    console.print(f"eval {printable(str(settings.source))} on lm-eval tasks {printable(shown)}", markup=False)
    result = evaluate_tasks(str(settings.source), target, settings)
    from lm_eval.utils import make_table

    console.print(make_table(result), markup=False, soft_wrap=True)
    kept = {key: result.get(key) for key in ("results", "groups", "n-shot", "versions", "higher_is_better")}
    out = job_dir.claim(job)
    job_dir.write_config(out, analysis.resolved.as_config(), job)
    text = json.dumps({k: v for k, v in kept.items() if v}, indent=1, default=str)
    written = write_text_atomic(out / "eval.json", text)
    console.print(f"wrote {printable(str(written))}", markup=False, soft_wrap=True)
    return 0
