"""``train``: a language model (token ids in, logits out) by next-token cross-entropy on the text of the
``data:`` section (README "Language models"); any other model by regressing a fixed random teacher of
the same plan (the job: ``jobs/train.py``).

Prints a progress bar with loss and tokens/s. Each run has its own directory, by default
``outputs/<model>/<date>_<time>/`` (``train.out_dir`` names another), holding its checkpoints, the
resolved config (``config.yaml``), one metrics record per step (``metrics.jsonl``; TensorBoard events
under ``tensorboard/`` when tensorboard is installed) and ``loss_curve.png``.

``train.resume=true`` continues this model's newest run that has checkpoints (the newest directory next
to this run's, ``outputs/<model>/``); ``train.resume=DIR`` continues the run in DIR (or, for a
checkpoint file, from that checkpoint); with ``train.out_dir``, that directory. A NaN/Inf loss or
gradient stops the run with the step and the tensor's name (exit 1). Checkpoints of an earlier run in
the directory stop a fresh run before it starts (exit 1) unless ``train.overwrite=true`` replaces it; a
directory another run holds (its lock) stops it too, naming the holder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from te_assembly.analysis.analyze import COMMON_SECTIONS, Analysis
from te_assembly.cli import job_dir
from te_assembly.cli.commands.session import Session, start
from te_assembly.diagnostics import printable
from te_assembly.engines.parallel.context import ParallelContext
from te_assembly.errors import Terminated
from te_assembly.jobs.events import Advanced
from te_assembly.jobs.target import Target
from te_assembly.jobs.text.settings import DataSettings
from te_assembly.jobs.train import StepRecord, check_can_train, train
from te_assembly.jobs.training import stopping
from te_assembly.jobs.training.checkpoint import CheckpointError, scan
from te_assembly.jobs.training.run_dir import check_unlocked, latest_run, newest_good, out_dir_of
from te_assembly.jobs.training.run_record import check_fresh_start
from te_assembly.jobs.training.settings import TrainSettings

SECTIONS = {**COMMON_SECTIONS, "train": TrainSettings, "data": DataSettings}
RUN_DIR = True


def main(analysis: Analysis, console: Console) -> int:
    session = start(analysis, console)
    settings: TrainSettings = session.section("train").for_task(session.plan.takes_token_ids)
    tokens = ("train.batch_tokens", settings.tokens)
    with session.distributed("train", tokens, settings.seq_len) as target:
        return _train(session, settings, console, target)


def _continued(target: str, settings: TrainSettings) -> TrainSettings:
    """``train.resume=PATH``: the run directory PATH (or the one holding checkpoint PATH)."""
    path = Path(target).expanduser()
    if path.is_file():
        if settings.resume_from and Path(settings.resume_from).expanduser().resolve() != path.resolve():
            raise CheckpointError(
                f"train.resume={target} and train.resume_from={settings.resume_from} name different "
                "checkpoints: give one"
            )
        return dataclasses.replace(settings, out_dir=str(path.parent), resume=True, resume_from=str(path))
    if not path.is_dir():
        raise CheckpointError(f"train.resume={target}: no such run directory or checkpoint file")
    if not scan(path):
        raise CheckpointError(f"train.resume={target}: {path} holds no checkpoint to continue")
    return dataclasses.replace(settings, out_dir=str(path), resume=True)


def run_directory(settings: TrainSettings, job: job_dir.JobDir) -> tuple[TrainSettings, list[str]]:
    """The settings with ``out_dir`` set to this run's directory and ``resume`` a bool, and what to tell
    the user about the choice (module docstring)."""
    if settings.out_dir is not None:
        return dataclasses.replace(settings, resume=bool(settings.resume)), []
    if isinstance(settings.resume, str):
        return _continued(settings.resume, settings), []
    if not settings.resume:
        return dataclasses.replace(settings, out_dir=str(job_dir.claim(job))), []
    if not job.default:  # hydra.run.dir named on the command line: that run
        return dataclasses.replace(settings, out_dir=str(job.path)), []
    chosen = Path(settings.resume_from).expanduser() if settings.resume_from else None
    if chosen is not None and chosen.is_file():  # a checkpoint by its path: its run
        return dataclasses.replace(settings, out_dir=str(chosen.parent)), []
    found = latest_run(job.runs_root, exclude=job.path)
    if found is not None:
        note = f"train.resume=true: continuing the newest run of {job.model} that has checkpoints, {found}"
        return dataclasses.replace(settings, out_dir=str(found)), [note]
    out = job_dir.claim(job)
    where = job.runs_root or out.parent
    note = f"train.resume=true: no run of {job.model} with checkpoints in {where}; starting one in {out}"
    return dataclasses.replace(settings, out_dir=str(out)), [note]


def _agreed(settings: TrainSettings, par: ParallelContext) -> tuple[TrainSettings, list[str]]:
    """Rank 0 decides the run directory (``run_directory``) and every rank gets its answer, or its
    error: the ranks of a job never disagree on where it writes (each rank's own Hydra folder is a
    scratch one, ``cli/app.py``)."""
    decided: tuple[dict[str, object] | None, list[str], str | None] = (None, [], None)
    if par.is_main:
        try:
            chosen, notes = run_directory(settings, job_dir.current("train"))
            decided = (dataclasses.asdict(chosen), notes, None)
        except CheckpointError as exc:
            decided = (None, [], str(exc))
    values, notes, problem = par.from_main(decided)
    if problem is not None:
        raise CheckpointError(problem)
    assert values is not None
    return dataclasses.replace(settings, **values), notes


@contextlib.contextmanager
def _signals_stop() -> Iterator[None]:
    """SIGTERM stops training as Ctrl-C does (the run says what it kept), instead of killing it
    mid-line; both wait for the end of the step they arrive in (``jobs/training/stopping.py``), a
    second one stops at once. The previous handlers come back after. Not under torchrun: its agent ends
    the other ranks with SIGTERM when one fails, and a rank waiting in a collective must die then, not
    wait for it."""
    from te_assembly.analysis.parallel.launch import current_launch

    if threading.current_thread() is not threading.main_thread() or current_launch().under_torchrun:
        yield
        return

    stops: dict[int, type[KeyboardInterrupt]] = {signal.SIGTERM: Terminated, signal.SIGINT: KeyboardInterrupt}

    def handler(signum: int, frame: Any) -> None:
        stopping.ask(stops[signum]())

    # A signal the parent set to be ignored (nohup, a shell's background job for SIGINT) stays ignored.
    previous = {s: signal.signal(s, handler) for s in stops if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for s, was in previous.items():
            signal.signal(s, was)


def _say_what_is_kept(out_dir: Path, console: Console) -> None:
    """After an interrupt: the checkpoint the run keeps and the command that continues from it."""
    good, _, _ = newest_good(scan(out_dir))
    if good is None:
        message = f"stopped before the first checkpoint: nothing of this run is kept in {out_dir}"
        console.print(printable(message), markup=False)
        return
    job = job_dir.current("train")
    kept = [o for o in job.overrides if not o.lstrip("+~").startswith(("train.resume", "hydra.run.dir"))]
    command = " ".join(["python -m te_assembly train", *kept, f"train.resume={out_dir}"])
    kept_line = f"stopped: the run keeps {good.path} (step {good.step}, verified); continue it with"
    console.print(printable(kept_line), markup=False, soft_wrap=True)
    console.print(f"  {printable(command)}", markup=False, soft_wrap=True)


def _data_words(data: DataSettings) -> str:
    from te_assembly.jobs.text.sources import DEFAULT_CORPUS

    where = f"data.path={data.path}" if data.path is not None else DEFAULT_CORPUS
    tok = data.tokenizer
    how = {
        "byte": "byte-level",
        "file": f"tokenizer {tok.path}",
        "bpe": f"a BPE of {tok.train_vocab} trained on it",
    }
    return f"{where} ({how[tok.kind]})"


def _evaluation_line(step: int, evaluation: dict[str, Any]) -> str:
    bpb = evaluation.get("val_bits_per_byte")
    line = (
        f"step {step}: validation loss {evaluation['val_loss']:.4f}, perplexity "
        f"{evaluation['val_perplexity']:.2f}"
    )
    return line + (f", {bpb:.3f} bits per byte" if isinstance(bpb, float) else "")


def _train(session: Session, settings: TrainSettings, console: Console, target: Target) -> int:
    plan, device, seed, par = session.plan, target.device, target.seed, target.context(session.plan)
    # Before the progress bar: a model without parameters, sizes that cannot fit, a bad path, a directory
    # another run holds, or an earlier run in the way fails first and alone (train() checks the
    # directory again under its lock). Every rank probes the lock (shared probes never collide).
    check_can_train(plan, settings, target)
    settings, notes = _agreed(settings, par)
    out_dir = out_dir_of(settings)
    check_unlocked(out_dir)
    check_fresh_start(out_dir, settings)
    par.barrier()  # every rank has probed before rank 0 takes the lock for the run
    for note in notes:
        console.print(note, markup=False, soft_wrap=True)
    console.print(f"run directory: {printable(str(out_dir))}", markup=False, soft_wrap=True)
    if par.is_parallel:
        console.print(
            f"parallel: {par.settings.describe()}; each rank trains on its rows of every batch", markup=False
        )
    data: DataSettings = session.section("data")
    task = (
        f"next-token cross-entropy on {_data_words(data)}"
        if plan.takes_token_ids
        else f"regress a teacher (seed {seed + settings.teacher_seed_offset})"
    )
    console.print(
        f"{printable(plan.name)}: {task} for {settings.steps} steps "
        f"of {settings.batch_tokens} tokens; {settings.optimizer} lr {settings.lr:g} ({settings.schedule}, "
        f"warm-up {settings.warmup_steps}), device {device}, dtype {target.dtype_name}",
        markup=False,
        soft_wrap=True,
    )
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("{task.fields[tps]} tok/s"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task("train", total=settings.steps, loss="-", tps="-")
        tokenizing: list[Any] = []

        def on_event(event: object) -> None:
            if isinstance(event, Advanced) and event.task == "tokenize" and event.total > 1 << 20:
                if not tokenizing:  # a bar only for a corpus big enough to take a while
                    tokenizing.append(progress.add_task("tokenize", total=event.total, loss="-", tps="-"))
                progress.update(tokenizing[0], completed=event.done)

        def on_step(record: StepRecord) -> None:
            progress.update(
                bar, completed=record.step, loss=f"{record.loss:.4g}", tps=f"{record.tokens_per_s:,.0f}"
            )
            if record.evaluation is not None:
                progress.console.print(_evaluation_line(record.step, record.evaluation), markup=False)

        try:
            with _signals_stop():
                result = train(
                    plan,
                    settings,
                    target,
                    on_step=on_step,
                    config=session.analysis.resolved.as_config(),
                    data=data,
                    on_event=on_event,
                )
        except KeyboardInterrupt:
            progress.stop()
            if par.is_main:
                _say_what_is_kept(out_dir, console)
            raise
    for note in result.notes:
        console.print(note, style="yellow", markup=False)
    if result.losses:
        head = result.losses[: min(5, len(result.losses))]
        tail = result.losses[-min(5, len(result.losses)) :]
        console.print(
            f"loss: first {sum(head) / len(head):.4g} (mean of {len(head)}), "
            f"last {sum(tail) / len(tail):.4g} "
            f"(mean of {len(tail)}) after step {result.last_step}",
            markup=False,
        )
    written = (
        *result.checkpoints[-1:],
        result.config_file,
        result.metrics_file,
        result.tokenizer_file,
        result.plot,
    )
    for path in written:
        if path is not None:
            console.print(f"wrote {printable(str(path))}", markup=False, soft_wrap=True)
    if result.tensorboard_dir is not None:
        console.print(
            f"TensorBoard events in {printable(str(result.tensorboard_dir))} "
            f"(tensorboard --logdir {printable(str(out_dir.parent))})",
            markup=False,
            soft_wrap=True,
        )
    return 0
