"""Continuing a run: which checkpoint (every rank agrees), the check that it is the same run, the state
restored, and the history before it (losses and validations, from ``metrics.jsonl``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch

from te_assembly.engines.parallel.context import ParallelContext
from te_assembly.formats import checkpoint
from te_assembly.formats.checkpoint import CheckpointError, read_meta
from te_assembly.jobs.train.metrics import METRICS_FILE, read_records
from te_assembly.jobs.train.run_dir import resume_point
from te_assembly.jobs.train.run_record import check_resumable
from te_assembly.jobs.train.settings import TrainSettings

T = TypeVar("T")


def decided_by_main(par: ParallelContext | None, decide: Callable[[], T]) -> T:
    """``decide()`` on rank 0, its answer (or its ``CheckpointError``) on every rank: the ranks of a
    job never disagree on where it writes or what it resumes. One process: ``decide()``."""
    if par is None:
        return decide()
    found: tuple[Any, str | None] = (None, None)
    if par.is_main:
        try:
            found = (decide(), None)
        except CheckpointError as exc:
            found = (None, str(exc))
    value, problem = par.from_main(found)
    if problem is not None:
        raise CheckpointError(problem)
    return value  # type: ignore[no-any-return]


def resume_from(
    par: ParallelContext | None, out_dir: Path, settings: TrainSettings
) -> tuple[Path | None, list[str]]:
    """The checkpoint to resume (rank 0 decides: it alone may set corrupt files aside) and notes."""

    def decide() -> tuple[str | None, list[str]]:
        path, notes = resume_point(out_dir, settings.resume_from)
        return (str(path) if path is not None else None), notes

    path, notes = decided_by_main(par, decide)
    main = par is None or par.is_main
    return (Path(path) if path is not None else None), (notes if main else [])


def restore(
    par: ParallelContext | None,
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    run: Mapping[str, Any],
    settings: TrainSettings,
    notes: list[str],
) -> tuple[int, list[float]]:
    """The checkpoint's state in ``model`` and ``optimizer`` once its run record matches ``run``; the
    step it holds and the losses up to it."""
    # Compared before loading: another optimizer's state would not even load cleanly.
    check_resumable(path, read_meta(path), run)
    ckpt, layout_note = checkpoint.load(par, path, model, optimizer)
    notes.extend([layout_note] if layout_note else [])
    meta = ckpt.meta
    if meta.get("planned_steps") != settings.steps and settings.schedule == "cosine":
        notes.append(
            f"the checkpoint's run planned {meta.get('planned_steps')} steps, this one {settings.steps}: "
            "the cosine schedule differs from the original run's"
        )
    losses = resumed_losses(ckpt.path, meta, ckpt.step, notes)
    notes.append(f"resumed from {ckpt.path} (step {ckpt.step})")
    return ckpt.step, losses


def resumed_losses(path: Path, meta: Mapping[str, Any], start: int, notes: list[str]) -> list[float]:
    """The losses of steps 1..start: from the run's ``metrics.jsonl`` (a checkpoint does not carry them,
    so it never grows with the step count), or from a checkpoint written before that (``losses`` in its
    metadata). Steps ``metrics.jsonl`` lacks (deleted, or written by hand) are NaN, with a note."""
    if "losses" in meta:
        losses = meta["losses"]
        if (
            not isinstance(losses, list)
            or len(losses) < start
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in losses)
        ):
            raise CheckpointError(f"{path} is corrupt: its loss history does not cover its {start} steps")
        return [float(v) for v in losses[:start]]
    metrics = path.parent / METRICS_FILE
    by_step: dict[int, float] = {}
    if metrics.is_file():
        for record in read_records(metrics):
            loss = record.get("loss")
            if record["step"] <= start and isinstance(loss, (int, float)) and not isinstance(loss, bool):
                by_step[record["step"]] = float(loss)
    missing = start - len(by_step)
    if missing:
        notes.append(
            f"{metrics} lacks the loss of {missing} of the {start} steps before the resume (shown as NaN)"
        )
    return [by_step.get(step, float("nan")) for step in range(1, start + 1)]


def earlier_evaluations(out_dir: Path, start: int) -> list[tuple[int, dict[str, Any]]]:
    """A resumed run's validation results up to its checkpoint, from ``metrics.jsonl``."""
    path = out_dir / METRICS_FILE
    if not start or not path.is_file():
        return []
    return [
        (int(r["step"]), {k: r.get(k) for k in ("val_loss", "val_perplexity", "val_bits_per_byte")})
        for r in read_records(path)
        if isinstance(r.get("step"), int)
        and r["step"] <= start
        and isinstance(r.get("val_loss"), (int, float))
    ]


__all__ = ["decided_by_main", "earlier_evaluations", "restore", "resume_from", "resumed_losses"]
