"""The training loop: student vs. teacher, optimizer, schedule, checkpoints, resume, non-finite guard."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from te_assembly.engines import build
from te_assembly.engines.base import AssembledModel, loss_output_names
from te_assembly.errors import NonFiniteError
from te_assembly.outputs import prepare_out_dir
from te_assembly.parallel import checkpoint as parallel_checkpoint
from te_assembly.parallel.context import ParallelContext
from te_assembly.plan import Plan
from te_assembly.train.checkpoint import (
    list_checkpoints,
    prune,
    read_meta,
    remove_stale_temp,
    write_text_atomic,
)
from te_assembly.train.optim import lr_at, make_optimizer, set_lr
from te_assembly.train.plot import save_loss_curve
from te_assembly.train.run_record import check_fresh_start, check_resumable, run_record
from te_assembly.train.settings import TrainSettings
from te_assembly.train.task import TeacherTask, loss_terms, perturb_constant_parameters


@dataclass(frozen=True)
class StepRecord:
    step: int
    """1-based."""
    end: int
    """The step this run stops after."""
    loss: float
    terms: dict[str, float]
    lr: float
    seconds: float
    """Student forward + backward + optimizer step (the teacher's forward is data, not timed)."""
    tokens_per_s: float


@dataclass
class TrainResult:
    losses: list[float]
    """Loss of every step so far, including steps before a resume: ``losses[i]`` is step ``i + 1``."""
    start_step: int
    """Steps already done when this run started (0 unless resumed)."""
    last_step: int
    checkpoints: list[Path] = field(default_factory=list)
    losses_file: Path | None = None
    plot: Path | None = None
    notes: list[str] = field(default_factory=list)
    model: AssembledModel | None = None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _check_loss(step: int, loss: torch.Tensor, terms: dict[str, torch.Tensor]) -> None:
    if bool(torch.isfinite(loss)):
        return
    culprit = next((name for name, t in terms.items() if not bool(torch.isfinite(t))), "loss")
    raise NonFiniteError(step, culprit, f"non-finite {culprit} at step {step}: {loss.item()}")


def _check_grads(step: int, model: torch.nn.Module) -> None:
    named = [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]
    if not named:
        return
    # One device sync for the common, all-finite case; the culprit search only runs on failure.
    if bool(torch.stack([torch.isfinite(g).all() for _, g in named]).all()):
        return
    name = next(n for n, g in named if not bool(torch.isfinite(g).all()))
    raise NonFiniteError(step, f"grad of {name}", f"non-finite gradient of {name} at step {step}")


def train(
    plan: Plan,
    settings: TrainSettings,
    *,
    engine: str = "reference",
    kernels: str = "te",
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    recipe: Mapping[str, Any] | None = None,
    on_step: Callable[[StepRecord], None] | None = None,
    parallel: ParallelContext | None = None,
) -> TrainResult:
    """Train ``plan`` to regress a teacher built from the same plan with seed ``seed + offset``.

    ``recipe`` is the TE engine's quantization recipe (teacher and student alike); the reference
    engine ignores it. Raises ``NonFiniteError`` (step, tensor name) when the loss or a gradient is
    NaN/Inf; ``CheckpointError`` when resuming from a checkpoint that does not fit or whose run had
    other settings (``run_record``). Before anything is built: ``OutputPathError`` when
    ``settings.out_dir`` cannot be written, ``ExistingRunError`` when it holds checkpoints and neither
    ``resume`` nor ``overwrite`` is set.

    ``parallel`` (``te_assembly.parallel``, under torchrun): every rank trains its slices on its rows of
    each batch (``batch_tokens`` is the whole batch); losses are means over ranks; rank 0 alone writes."""
    par = parallel if parallel is not None else ParallelContext.single(plan)
    dev = torch.device(device)
    out_dir = prepare_out_dir(settings.out_dir)
    check_fresh_start(out_dir, settings)
    notes: list[str] = (
        [f"removed stale temp file {p}" for p in remove_stale_temp(out_dir)] if par.is_main else []
    )

    torch.manual_seed(seed + settings.teacher_seed_offset)
    teacher = build(plan, engine=engine, kernels=kernels, device=dev, dtype=dtype, recipe=recipe)
    perturb_constant_parameters(teacher)
    torch.manual_seed(seed)
    student = build(
        plan, engine=engine, kernels=kernels, device=dev, dtype=dtype, recipe=recipe, parallel=parallel
    )
    student.train()
    model = par.wrap(student)
    optimizer = make_optimizer(student.parameters(), settings)
    task = TeacherTask(
        plan,
        teacher,
        seed=seed,
        tokens=settings.batch_tokens,
        device=dev,
        dtype=dtype,
        rows=(lambda x, inputs: (par.local_rows(x), par.local_inputs(inputs))) if par.is_parallel else None,
    )
    loss_names = loss_output_names(plan)

    run = run_record(
        settings,
        plan=plan.name,
        seed=seed,
        engine=student.engine,
        kernels=kernels,
        dtype=dtype,
        recipe=recipe,
    )
    losses: list[float] = []
    start = 0
    existing = list_checkpoints(out_dir)
    par.barrier()  # every rank has listed the directory before rank 0 may delete anything in it
    if settings.resume and existing:
        latest = existing[-1][1]
        # Compared before loading: another optimizer's state would not even load cleanly.
        check_resumable(latest, read_meta(latest), run)
        ckpt, layout_note = parallel_checkpoint.load(par, latest, student, optimizer)
        notes.extend([layout_note] if layout_note else [])
        meta = ckpt.meta
        if meta.get("planned_steps") != settings.steps and settings.schedule == "cosine":
            notes.append(
                f"the checkpoint's run planned {meta.get('planned_steps')} steps, this one {settings.steps}: "
                "the cosine schedule differs from the original run's"
            )
        start = ckpt.step
        losses = [float(v) for v in meta["losses"]][:start]
        notes.append(f"resumed from {ckpt.path} (step {start})")
    elif settings.resume:
        notes.append(f"no checkpoint in {out_dir}: starting from step 1")
    elif existing:
        for _, p in existing if par.is_main else ():
            p.unlink()
        notes.append(
            f"removed {len(existing)} checkpoint(s) of an earlier run in {out_dir} (train.overwrite=true)"
        )

    end = min(settings.steps, settings.stop_after or settings.steps)
    if start >= end:
        notes.append(f"nothing to do: already at step {start} (train.steps={settings.steps})")
    checkpoints: list[Path] = []
    meta_base = {
        "plan": plan.name,
        "seed": seed,
        "planned_steps": settings.steps,
        "engine": student.engine,
        "run": run,
        "settings": dataclasses.asdict(settings),
    }
    for step in range(start + 1, end + 1):
        batch = task.batch(step)
        lr = lr_at(step, settings)
        set_lr(optimizer, lr)
        optimizer.zero_grad(set_to_none=True)
        _sync(dev)
        began = time.perf_counter()
        y, extras = model(batch.x, **batch.inputs)
        terms = loss_terms(y, batch.target, extras, loss_names)
        loss = torch.stack(list(terms.values())).sum()
        inject = settings.inject_nan_at_step == step
        if inject and settings.inject_nan_into == "loss":
            loss = loss * float("nan")
        value = par.mean(loss.item())  # every rank agrees on the loss, and on whether it is finite
        _check_loss(step, loss, terms)
        if not math.isfinite(value):
            raise NonFiniteError(step, "loss", f"non-finite loss on another rank at step {step}: {value}")
        loss.backward()
        par.finish_grads(student)
        if inject and settings.inject_nan_into == "grad":
            first = next(p for p in student.parameters() if p.grad is not None)
            first.grad.view(-1)[0] = float("nan")  # type: ignore[union-attr]
        _check_grads(step, student)
        optimizer.step()
        _sync(dev)
        seconds = time.perf_counter() - began
        losses.append(value)
        if on_step is not None:
            record = StepRecord(
                step,
                end,
                value,
                {k: t.item() for k, t in terms.items()},
                lr,
                seconds,
                settings.batch_tokens / seconds if seconds > 0 else float("inf"),
            )
            on_step(record)
        every = settings.checkpoint_every
        if step == end or (every and step % every == 0):
            meta = {**meta_base, "losses": losses}
            written = parallel_checkpoint.save(par, out_dir, step, student, optimizer, meta)
            if written is not None:
                checkpoints.append(written)
                prune(out_dir, settings.keep_checkpoints)

    result = TrainResult(losses, start, max(start, end), checkpoints, notes=notes, model=student)
    if losses and par.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        result.losses_file = out_dir / "losses.json"
        write_text_atomic(result.losses_file, json.dumps({"plan": plan.name, "losses": losses}, indent=1))
        if settings.plot:
            title = f"{plan.name}: teacher regression ({student.engine} engine)"
            result.plot = save_loss_curve(losses, out_dir / "loss_curve.png", title, start or None)
    return result
