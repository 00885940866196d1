"""The training loop: student vs. teacher, optimizer, schedule, checkpoints, resume, non-finite guard."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from te_assembly.analysis.plan import Plan
from te_assembly.analysis.recipes import checked_recipe
from te_assembly.diagnostics import error
from te_assembly.engines.base import AssembledModel, loss_output_names
from te_assembly.engines.parallel.context import ParallelContext, local_piece
from te_assembly.errors import ArgumentError, ConfigError, NonFiniteError
from te_assembly.jobs import objective
from te_assembly.jobs.events import Advanced, OnEvent, ignore
from te_assembly.jobs.pretrained import TOKENIZER_FILE
from te_assembly.jobs.target import NO_RECIPE, Target
from te_assembly.jobs.text.settings import DataSettings
from te_assembly.jobs.training import parallel_checkpoint, stopping
from te_assembly.jobs.training.checkpoint import (
    CheckpointError,
    prune,
    read_meta,
    remove_stale_temp,
)
from te_assembly.jobs.training.lm_task import LanguageTask
from te_assembly.jobs.training.metrics import METRICS_FILE, MetricsLog, check_tensorboard, read_records
from te_assembly.jobs.training.optim import lr_at, make_optimizer, set_lr
from te_assembly.jobs.training.run_dir import (
    RunLock,
    out_dir_of,
    previous_run,
    remove_previous_run,
    resume_point,
)
from te_assembly.jobs.training.run_record import check_fresh_start, check_resumable, record_sha256, run_record
from te_assembly.jobs.training.settings import TrainSettings
from te_assembly.jobs.training.task import TeacherTask, perturb_constant_parameters
from te_assembly.outputs import config_text, write_text_atomic
from te_assembly.views.loss_curve import save_loss_curve


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
    grad_norm: float = float("nan")
    """The whole model's gradient norm before the optimizer step."""
    wall_time: float = 0.0
    """Seconds since the epoch when the step ended."""
    elapsed_s: float = 0.0
    """Seconds since this invocation started training."""
    evaluation: dict[str, Any] | None = None
    """A language model's validation after this step (``val_loss``, ``val_perplexity``,
    ``val_bits_per_byte``), on the steps it is evaluated."""

    def metrics(self) -> dict[str, Any]:
        """The record ``metrics.jsonl`` keeps (``training/metrics.py``)."""
        return {
            **(self.evaluation or {}),
            "step": self.step,
            "loss": self.loss,
            "terms": dict(self.terms),
            "lr": self.lr,
            "grad_norm": self.grad_norm,
            "tokens_per_s": self.tokens_per_s,
            "step_time_s": self.seconds,
            "wall_time": self.wall_time,
            "elapsed_s": self.elapsed_s,
        }


@dataclass
class TrainResult:
    losses: list[float]
    """Loss of every step so far, including steps before a resume: ``losses[i]`` is step ``i + 1``."""
    start_step: int
    """Steps already done when this run started (0 unless resumed)."""
    last_step: int
    checkpoints: list[Path] = field(default_factory=list)
    metrics_file: Path | None = None
    """``metrics.jsonl``: one record per step (``training/metrics.py``)."""
    tensorboard_dir: Path | None = None
    config_file: Path | None = None
    plot: Path | None = None
    notes: list[str] = field(default_factory=list)
    model: AssembledModel | None = None
    evaluations: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    """A language model's validation results by step, this invocation's and (resumed) the earlier ones
    ``metrics.jsonl`` holds."""
    tokenizer_file: Path | None = None
    """``tokenizer.json`` beside the run (a tokenizer file or a trained BPE; byte-level needs none)."""


def _check_loss(step: int, loss: torch.Tensor, terms: dict[str, torch.Tensor]) -> None:
    if bool(torch.isfinite(loss)):
        return
    culprit = next((name for name, t in terms.items() if not bool(torch.isfinite(t))), "loss")
    raise NonFiniteError(step, culprit, f"non-finite {culprit} at step {step}: {loss.item()}")


def _check_grads(step: int, model: torch.nn.Module, par: ParallelContext) -> None:
    """``NonFiniteError`` for a NaN/Inf gradient. Under FSDP2 each rank holds a piece of each gradient,
    so the ranks agree on the answer (every rank raises, none waits at the next collective)."""
    named = [(n, local_piece(p.grad)) for n, p in model.named_parameters() if p.grad is not None]
    # One device sync for the common, all-finite case; the culprit search only runs on failure.
    finite = not named or bool(torch.stack([torch.isfinite(g).all() for _, g in named]).all())
    if par.is_sharded:
        finite = par.all_agree(finite)
    if finite:
        return
    name = next((n for n, g in named if not bool(torch.isfinite(g).all())), "a parameter on another rank")
    raise NonFiniteError(step, f"grad of {name}", f"non-finite gradient of {name} at step {step}")


def check_can_train(plan: Plan, settings: TrainSettings, target: Target) -> None:
    """``ConfigError`` for a model without parameters, or a batch that does not split into
    ``grad_accum`` micro-batches of whole sequences; ``ResourceError`` when the model (and a teacher's),
    gradients, optimizer state and one micro-batch's activations cannot fit in memory (estimated, nothing
    allocated). ``settings``: decided for the task (``TrainSettings.for_task``)."""
    settings = settings.for_task(plan.takes_token_ids)
    micro = settings.tokens // settings.grad_accum
    unit = settings.positions if plan.takes_sequences else 1
    if settings.tokens % settings.grad_accum or micro % unit:
        what = f"whole sequences of train.seq_len={unit}" if unit > 1 else "equal micro-batches"
        raise ConfigError(
            [
                error(
                    "train.grad_accum",
                    "partial-micro-batch",
                    f"train.batch_tokens={settings.tokens} does not split into train.grad_accum="
                    f"{settings.grad_accum} micro-batches of {what}",
                    f"use a train.batch_tokens that is a multiple of {settings.grad_accum * unit}",
                )
            ]
        )
    if plan.num_params == 0:
        raise ConfigError(
            [
                error(
                    "model",
                    "nothing-to-train",
                    f"{plan.name} has no parameters: there is nothing to train (run and bench work on it)",
                )
            ]
        )
    target.check_fits(
        plan,
        f"training {plan.name}",
        "lower train.batch_tokens (or raise train.grad_accum) or make the model smaller",
        tokens=micro,
        models=1 if plan.takes_token_ids else 2,  # the teacher task holds a second model
        trained=1,
        optimizer=settings.optimizer,
        seq_len=settings.positions,
        checkpointing=settings.activation_checkpointing,
    )


def _resumed_losses(path: Path, meta: Mapping[str, Any], start: int, notes: list[str]) -> list[float]:
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


def _earlier_evaluations(out_dir: Path, start: int) -> list[tuple[int, dict[str, Any]]]:
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


def _resume_point(
    par: ParallelContext, out_dir: Path, settings: TrainSettings
) -> tuple[Path | None, list[str]]:
    """Rank 0 decides (it alone may set corrupt files aside); every rank gets its answer, or its error."""
    found: tuple[str | None, list[str], str | None] = (None, [], None)
    if par.is_main:
        try:
            path, notes = resume_point(out_dir, settings.resume_from)
            found = (str(path) if path is not None else None, notes, None)
        except CheckpointError as exc:
            found = (None, [], str(exc))
    path_text, notes, problem = par.from_main(found)
    if problem is not None:
        raise CheckpointError(problem)
    return (Path(path_text) if path_text is not None else None), (notes if par.is_main else [])


def train(
    plan: Plan,
    settings: TrainSettings,
    target: Target | None = None,
    *,
    recipe_config: Mapping[str, Any] | None = None,
    on_step: Callable[[StepRecord], None] | None = None,
    config: Mapping[str, Any] | None = None,
    engine: str = "reference",
    kernels: str = "te",
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    recipe: Mapping[str, Any] | None = None,
    parallel: ParallelContext | None = None,
    data: DataSettings | None = None,
    on_event: OnEvent = ignore,
) -> TrainResult:
    """Train ``plan``: a language model (token ids in, logits out) by next-token cross-entropy on the
    text ``data`` names (default: ``DataSettings()``, the default corpus), any other model to regress a
    teacher built from the same plan with seed ``seed + offset``.

    ``target``: engine, kernels, device, dtype, recipe (the TE engine's, teacher and student alike; the
    reference engine ignores it), seed and parallel layout; without one, the keywords ``engine``,
    ``kernels``, ``device``, ``dtype``, ``seed``, ``recipe`` and ``parallel`` describe it.
    ``recipe_config``, the invocation's recipe config, is what the run records (default: the recipe).
    The run holds ``settings.out_dir``'s lock from start to end (``run_dir``; rank 0 of a parallel run
    holds it for the job).

    Raises, before anything is built: ``ConfigError`` for a model without parameters;
    ``ResourceError`` when teacher, student, optimizer and one batch's activations cannot fit in memory;
    ``OutputPathError`` when ``out_dir`` cannot be written; ``RunDirectoryInUseError`` when another run
    holds it; ``ExistingRunError`` when it holds checkpoints and neither ``resume`` nor ``overwrite`` is
    set; ``CheckpointError`` when the checkpoint to resume is corrupt (naming the newest good one) or
    its run had other settings. While running: ``NonFiniteError`` (step, tensor name) when the loss, a
    gradient or (before a checkpoint is written) a parameter is NaN/Inf; ``CheckpointError`` when a
    checkpoint cannot be written (disk full...), every earlier file intact.

    A parallel target (under torchrun): every rank trains its slices on its rows of
    each batch (``batch_tokens`` is the whole batch); losses are means over ranks; rank 0 alone writes.

    Besides checkpoints, the run directory gets ``metrics.jsonl`` (one record per step, as it goes;
    ``training/metrics.py``), TensorBoard events under ``tensorboard/`` when ``tensorboard`` is installed
    (``MissingToolError`` before anything starts if ``settings.tensorboard`` is true and it is not),
    ``loss_curve.png``, and ``config`` (the invocation's resolved config, if given) as ``config.yaml``."""
    if target is None:
        recorded = recipe_config if recipe_config is not None else recipe
        chosen = checked_recipe(recipe) if recipe is not None else NO_RECIPE
        target = Target(engine, kernels, torch.device(device), dtype, chosen, seed, parallel)
    else:
        recorded = recipe_config if recipe_config is not None else target.recipe
    par = target.context(plan)
    if settings.out_dir is None:
        raise ArgumentError(
            "train() writes into settings.out_dir: set it (the train command uses its run directory)"
        )
    settings = settings.for_task(plan.takes_token_ids)
    check_can_train(plan, settings, target)
    tensorboard = check_tensorboard(settings.tensorboard) if par.is_main else False
    out_dir = out_dir_of(settings)
    language: LanguageTask | None = None
    if plan.takes_token_ids:  # the data is read (and any problem with it found) before the run starts
        data = data if data is not None else DataSettings()
        language = LanguageTask.prepare(
            plan,
            data,
            target,
            tokens=settings.tokens,
            seq_len=settings.positions,
            z_loss=settings.z_loss,
            progress=lambda done, total: on_event(Advanced("tokenize", done, total, "tokenizing")),
        )
    lock = RunLock(out_dir) if par.is_main else contextlib.nullcontext()
    with lock:
        return _train_locked(
            plan,
            settings,
            out_dir,
            target=target,
            recorded_recipe=recorded,
            on_step=on_step,
            par=par,
            config=config,
            tensorboard=tensorboard,
            language=(language, data) if language is not None and data is not None else None,
        )


def _train_locked(
    plan: Plan,
    settings: TrainSettings,
    out_dir: Path,
    *,
    target: Target,
    recorded_recipe: Mapping[str, Any] | None,
    on_step: Callable[[StepRecord], None] | None,
    par: ParallelContext,
    config: Mapping[str, Any] | None,
    tensorboard: bool,
    language: tuple[LanguageTask, DataSettings] | None,
) -> TrainResult:
    seed = target.seed
    check_fresh_start(out_dir, settings)
    notes: list[str] = (
        [f"removed stale temp file {p}" for p in remove_stale_temp(out_dir)] if par.is_main else []
    )
    resume_from: Path | None = None
    if settings.resume:
        resume_from, found_notes = _resume_point(par, out_dir, settings)
        notes.extend(found_notes)
    # train.overwrite: the earlier run stays whole until this one has a verified checkpoint.
    earlier_run = previous_run(out_dir) if settings.overwrite and par.is_main else []

    task: TeacherTask | LanguageTask
    if language is not None:
        task = language[0]
    else:
        teacher = target.build(plan, seed=seed + settings.teacher_seed_offset, split=False)
        perturb_constant_parameters(teacher)
        task = TeacherTask(plan, teacher, target, tokens=settings.tokens, seq_len=settings.positions)
    student = target.build(plan, seed=seed, activation_checkpointing=settings.activation_checkpointing)
    student.train()
    model = par.wrap(student)
    optimizer = make_optimizer(student.parameters(), settings)
    loss_names = loss_output_names(plan)

    run = run_record(
        settings,
        plan=plan,
        seed=seed,
        engine=student.engine,
        kernels=target.kernels,
        dtype=target.dtype,
        recipe=recorded_recipe,
        data=language[0].record(language[1]) if language is not None else None,
    )
    run_sha256 = record_sha256(run)
    losses: list[float] = []
    start = 0
    par.barrier()  # every rank has read the directory before rank 0 changes anything in it
    if resume_from is not None:
        # Compared before loading: another optimizer's state would not even load cleanly.
        check_resumable(resume_from, read_meta(resume_from), run)
        ckpt, layout_note = parallel_checkpoint.load(par, resume_from, student, optimizer)
        notes.extend([layout_note] if layout_note else [])
        meta = ckpt.meta
        if meta.get("planned_steps") != settings.steps and settings.schedule == "cosine":
            notes.append(
                f"the checkpoint's run planned {meta.get('planned_steps')} steps, this one {settings.steps}: "
                "the cosine schedule differs from the original run's"
            )
        start = ckpt.step
        losses = _resumed_losses(ckpt.path, meta, start, notes)
        notes.append(f"resumed from {ckpt.path} (step {start})")
    elif settings.resume:
        notes.append(f"no checkpoint in {out_dir}: starting from step 1")
    if resume_from is None and settings.init_from is not None:
        from te_assembly.jobs.pretrained import load_pretrained_weights

        load_pretrained_weights(student, settings.init_from)
        notes.append(f"started from the weights of {settings.init_from}")

    end = min(settings.steps, settings.stop_after or settings.steps)
    if start >= end:
        notes.append(f"nothing to do: already at step {start} (train.steps={settings.steps})")
    # train.overwrite: this run's files wait for its first checkpoint (the earlier run's stay whole).
    tokenizer = language[0].corpus.tokenizer if language is not None else None
    files = (
        _RunFiles(out_dir, config, start, tensorboard, hold=bool(earlier_run), tokenizer=tokenizer)
        if par.is_main
        else None
    )
    try:
        return _steps(
            plan,
            settings,
            out_dir,
            run=_Training(
                student, model, optimizer, task, loss_names, par, target, files, earlier_run, notes
            ),
            start=start,
            end=end,
            losses=losses,
            meta_base={
                "plan": plan.name,
                "seed": seed,
                "planned_steps": settings.steps,
                "engine": student.engine,
                "run": run,
                "run_sha256": run_sha256,
                "settings": dataclasses.asdict(settings),
            },
            on_step=on_step,
        )
    finally:
        if files is not None:
            files.close()


class _RunFiles:
    """What the run writes besides checkpoints while it goes: ``config.yaml`` and the metrics."""

    def __init__(
        self,
        out_dir: Path,
        config: Mapping[str, Any] | None,
        start: int,
        tensorboard: bool,
        hold: bool,
        tokenizer: Any = None,
    ) -> None:
        self.out_dir, self.config, self.tokenizer = out_dir, config, tokenizer
        self.config_file: Path | None = None
        self.tokenizer_file: Path | None = None
        self.metrics = MetricsLog(out_dir, start_step=start, tensorboard=tensorboard, hold=hold)
        if not hold:
            self._write_config()

    def _write_config(self) -> None:
        if self.config is not None:
            self.config_file = write_text_atomic(self.out_dir / "config.yaml", config_text(self.config))
        if self.tokenizer is not None:  # generate and export read it back (byte-level writes none)
            self.tokenizer_file = self.tokenizer.save(self.out_dir / TOKENIZER_FILE)

    def commit(self) -> None:
        """The earlier run is gone (``train.overwrite``): this run's files now take its place."""
        self._write_config()
        self.metrics.commit()

    def close(self) -> None:
        self.metrics.close()


@dataclass
class _Training:
    """What the step loop works with: the models, optimizer and data, where its files go, and the notes
    for the user it adds to."""

    student: AssembledModel
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    task: TeacherTask | LanguageTask
    loss_names: tuple[str, ...]
    par: ParallelContext
    target: Target
    files: _RunFiles | None
    earlier_run: list[Path]
    notes: list[str]


def _update(
    run: _Training, settings: TrainSettings, step: int, lr: float
) -> tuple[float, dict[str, float], float, float]:
    """One optimizer step over ``grad_accum`` micro-batches: the loss and its terms (means over ranks),
    the gradient norm before clipping, and the seconds from the batches being ready to the update done."""
    student, model, optimizer, task, par = run.student, run.model, run.optimizer, run.task, run.par
    micros = settings.grad_accum
    batches = [task.batch(step, micro, micros) for micro in range(micros)]
    set_lr(optimizer, lr)
    optimizer.zero_grad(set_to_none=True)
    run.target.sync()
    began = time.perf_counter()
    inject = settings.inject_nan_at_step == step
    value, summed = 0.0, dict[str, float]()
    for batch in batches:
        y, extras = model(batch.x, **batch.inputs)
        terms = task.terms(y, extras, batch, run.loss_names)
        loss = objective.total(terms)
        if inject and settings.inject_nan_into == "loss":
            loss = loss * float("nan")
        part = par.mean(loss.item())  # every rank agrees on the loss, and on whether it is finite
        _check_loss(step, loss, terms)
        if not math.isfinite(part):
            raise NonFiniteError(step, "loss", f"non-finite loss on another rank at step {step}: {part}")
        (loss / micros if micros > 1 else loss).backward()
        value += part / micros
        for k, t in terms.items():
            summed[k] = summed.get(k, 0.0) + par.mean(t.item()) / micros
    par.finish_grads(student)
    if inject and settings.inject_nan_into == "grad":
        first = next(p for p in student.parameters() if p.grad is not None)
        local_piece(first.grad).view(-1)[0] = float("nan")  # type: ignore[arg-type]
    _check_grads(step, student, par)
    grad_norm = par.norm_of_grads(student)
    if settings.clip_grad_norm is not None and grad_norm > settings.clip_grad_norm:
        scale = settings.clip_grad_norm / (grad_norm + 1e-6)
        for p in student.parameters():
            if p.grad is not None:
                p.grad.mul_(scale)
    optimizer.step()
    run.target.sync()
    return value, summed, grad_norm, time.perf_counter() - began


def _steps(
    plan: Plan,
    settings: TrainSettings,
    out_dir: Path,
    *,
    run: _Training,
    start: int,
    end: int,
    losses: list[float],
    meta_base: dict[str, Any],
    on_step: Callable[[StepRecord], None] | None,
) -> TrainResult:
    student, model, optimizer, task, par = run.student, run.model, run.optimizer, run.task, run.par
    notes, earlier_run, files = run.notes, run.earlier_run, run.files
    checkpoints: list[Path] = []
    evaluations = _earlier_evaluations(out_dir, start) if par.is_main and task.is_language_model else []
    began_training = time.perf_counter()
    with stopping.at_step_ends():
        for step in range(start + 1, end + 1):
            stopping.stop_if_asked()
            lr = lr_at(step, settings)
            value, summed, grad_norm, seconds = _update(run, settings, step, lr)
            losses.append(value)
            evaluation = None
            every = settings.eval_every
            if task.is_language_model and (step == end or (every and step % every == 0)):
                found = task.evaluate(model, settings.eval_batches)
                if found is not None:
                    evaluation = found.metrics()
                    evaluations.append((step, evaluation))
            record = StepRecord(
                step,
                end,
                value,
                summed,
                lr,
                seconds,
                settings.tokens / seconds if seconds > 0 else float("inf"),
                grad_norm,
                time.time(),
                time.perf_counter() - began_training,
                evaluation,
            )
            if files is not None:
                files.metrics.record(record.metrics())
            if on_step is not None:
                on_step(record)
            every = settings.checkpoint_every
            if step == end or (every and step % every == 0):
                meta = dict(meta_base)  # the loss history lives in metrics.jsonl, not in every checkpoint
                written = parallel_checkpoint.save(par, out_dir, step, student, optimizer, meta)
                if written is None:  # another rank: rank 0 writes
                    continue
                checkpoints.append(written)
                if earlier_run:
                    remove_previous_run(earlier_run, keep=[written])
                    count = sum(p.suffix == ".safetensors" for p in earlier_run)
                    notes.append(
                        f"removed {count} checkpoint(s) of an earlier run in {out_dir} once this run's first "
                        "checkpoint was written (train.overwrite=true)"
                    )
                    earlier_run = []
                    if files is not None:
                        files.commit()
                prune(out_dir, settings.keep_checkpoints, latest=written, run_sha256=meta_base["run_sha256"])

    result = TrainResult(
        losses, start, max(start, end), checkpoints, notes=notes, model=student, evaluations=evaluations
    )
    if files is not None and not earlier_run:
        result.metrics_file = files.metrics.path
        result.config_file = files.config_file
        result.tokenizer_file = files.tokenizer_file
        if files.metrics.use_tensorboard:
            result.tensorboard_dir = files.metrics.tensorboard_dir
    if losses and par.is_main:
        if settings.plot:
            what = "next-token cross-entropy" if task.is_language_model else "teacher regression"
            title = f"{plan.name}: {what} ({student.engine} engine)"
            validation = [(s, e["val_loss"]) for s, e in evaluations]
            result.plot = save_loss_curve(
                losses, out_dir / "loss_curve.png", title, start or None, validation
            )
    return result
