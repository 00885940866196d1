"""``train``: a short run regressing a fixed random teacher of the same plan (see ``te_assembly.train``).

Prints a progress bar with loss and tokens/s, writes checkpoints, ``losses.json`` and
``loss_curve.png`` to ``train.out_dir``. A NaN/Inf loss or gradient stops the run with the step and the
tensor's name (exit 1). Checkpoints of an earlier run in ``train.out_dir`` stop it before it starts
(exit 1) unless ``train.resume=true`` continues that run or ``train.overwrite=true`` replaces it; a
directory another run holds (its lock) stops it too, naming the holder.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from te_assembly.cli.commands.session import Session, start
from te_assembly.diagnostics import printable
from te_assembly.parallel.context import ParallelContext
from te_assembly.train import StepRecord, TrainSettings, train
from te_assembly.train.loop import check_can_train
from te_assembly.train.run_dir import check_unlocked, out_dir_of
from te_assembly.train.run_record import check_fresh_start
from te_assembly.validate.analysis import COMMON_SECTIONS, Analysis

SECTIONS = {**COMMON_SECTIONS, "train": TrainSettings}


def main(analysis: Analysis, console: Console) -> int:
    session = start(analysis, console)
    settings: TrainSettings = session.section("train")
    with session.parallel("train", ("train.batch_tokens", settings.batch_tokens), settings.seq_len) as par:
        return _train(session, settings, console, par)


def _train(session: Session, settings: TrainSettings, console: Console, par: ParallelContext) -> int:
    plan, device, dtype, seed = session.plan, par.device(session.device), session.dtype, session.seed
    # Before the progress bar: a model without parameters, sizes that cannot fit, a bad path, a directory
    # another run holds, or an earlier run in the way fails first and alone (train() checks the
    # directory again under its lock). Every rank probes the lock (shared probes never collide).
    check_can_train(plan, settings, device, dtype)
    out_dir = out_dir_of(settings)
    check_unlocked(out_dir)
    check_fresh_start(out_dir, settings)
    par.barrier()  # every rank has probed before rank 0 takes the lock for the run
    if par.is_parallel:
        console.print(
            f"parallel: {par.settings.describe()}; each rank trains on its rows of every batch", markup=False
        )
    console.print(
        f"{printable(plan.name)}: regress a teacher (seed {seed + settings.teacher_seed_offset}) "
        f"for {settings.steps} steps "
        f"of {settings.batch_tokens} tokens; {settings.optimizer} lr {settings.lr:g} ({settings.schedule}, "
        f"warm-up {settings.warmup_steps}), device {device}, dtype {str(dtype).removeprefix('torch.')}",
        markup=False,
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
        task = progress.add_task("train", total=settings.steps, loss="-", tps="-")

        def on_step(record: StepRecord) -> None:
            progress.update(
                task, completed=record.step, loss=f"{record.loss:.4g}", tps=f"{record.tokens_per_s:,.0f}"
            )

        result = train(
            plan,
            settings,
            engine=session.engine,
            kernels=session.kernels,
            device=device,
            dtype=dtype,
            seed=seed,
            recipe=session.engine_recipe,
            recipe_config=session.recipe,
            on_step=on_step,
            parallel=par,
        )
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
    for path in (*result.checkpoints[-1:], result.losses_file, result.plot):
        if path is not None:
            console.print(f"wrote {path}", markup=False)
    return 0
