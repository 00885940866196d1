"""The training loop: one optimizer step (``Stepper``), the loop over steps (``Loop``: the step, its
validation for a language model, its metrics record, its checkpoint), and the files a run writes
besides checkpoints (``RunFiles``).

A step is ``grad_accum`` micro-batches forward and backward, the non-finite guard, the gradient norm and
clipping, the update. A single process (``par`` None) does nothing else: no collective, no bookkeeping.
A parallel run adds exactly what it needs: the loss as the mean over ranks, the gradients finished
across ranks (expert and sequence-parallel reductions), the agreement that every rank's gradients are
finite, and the norm of the whole model's gradient. Signals that arrive during a step wait for its end,
checkpoint included (``stopping.py``).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from te_assembly.engines.head_chunks import reduced_logits
from te_assembly.engines.parallel.context import ParallelContext
from te_assembly.engines.parallel.pieces import local_piece
from te_assembly.engines.reference.packing import packed
from te_assembly.engines.target import Target
from te_assembly.errors import NonFiniteError
from te_assembly.files.ownership import config_text
from te_assembly.files.write import write_text_atomic
from te_assembly.formats import checkpoint
from te_assembly.formats.checkpoint import prune
from te_assembly.formats.checkpoint.background import BackgroundWriter
from te_assembly.formats.pretrained import TOKENIZER_FILE
from te_assembly.jobs import objective
from te_assembly.jobs.events import OnEvent
from te_assembly.jobs.train import stopping
from te_assembly.jobs.train.lm_task import LanguageTask
from te_assembly.jobs.train.metrics import MetricsLog
from te_assembly.jobs.train.result import StepRecord
from te_assembly.jobs.train.run_dir import remove_previous_run
from te_assembly.jobs.train.schedule import lr_at, set_lr
from te_assembly.jobs.train.settings import TrainSettings
from te_assembly.jobs.train.task import TeacherTask


@dataclass(frozen=True)
class Update:
    loss: float
    """The step's loss (the mean over micro-batches, and over ranks)."""
    terms: dict[str, float]
    grad_norm: float
    """The whole model's gradient norm before clipping."""
    seconds: float
    """From the batches being ready to the update done."""
    measures: dict[str, float] = field(default_factory=dict)
    """What the task measures beside the loss (DPO's rewards), the mean over micro-batches."""


@dataclass
class Stepper:
    """What one step works with: the model as trained (``model``: the student, wrapped for a parallel
    run), its optimizer, the task the batches and loss come from, and ``par`` for a parallel run."""

    student: torch.nn.Module
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    task: TeacherTask | LanguageTask
    loss_names: Sequence[str]
    target: Target
    par: ParallelContext | None

    def update(self, settings: TrainSettings, step: int, lr: float) -> Update:
        """One optimizer step over ``grad_accum`` micro-batches (module docstring)."""
        micros, par = settings.grad_accum, self.par
        batches = [self.task.batch(step, micro, micros) for micro in range(micros)]
        set_lr(self.optimizer, lr)
        self.optimizer.zero_grad(set_to_none=True)
        self.target.sync()
        began = time.perf_counter()
        inject = settings.inject_nan_at_step == step
        value, summed, measures = 0.0, dict[str, float](), dict[str, float]()
        for batch in batches:
            asked = self.task.head_request(batch)
            with packed(self.student, batch.documents), reduced_logits(self.student, asked):
                y, extras = self.model(batch.x, **batch.inputs)
            terms = self.task.terms(y, extras, batch, self.loss_names)
            for name, measured in getattr(self.task, "measures", {}).items():
                measures[name] = measures.get(name, 0.0) + measured / micros
            loss = objective.total(terms)
            if inject and settings.inject_nan_into == "loss":
                loss = loss * float("nan")
            part = loss.item() if par is None else par.mean(loss.item())  # ranks agree on finiteness
            _check_loss(step, loss, terms)
            if not math.isfinite(part):
                raise NonFiniteError(step, "loss", f"non-finite loss on another rank at step {step}: {part}")
            (loss / micros if micros > 1 else loss).backward()
            value += part / micros
            for k, t in terms.items():
                summed[k] = summed.get(k, 0.0) + (t.item() if par is None else par.mean(t.item())) / micros
        if par is not None:
            par.finish_grads(self.student)
        if inject and settings.inject_nan_into == "grad":
            first = next(p for p in self.student.parameters() if p.grad is not None)
            local_piece(first.grad).view(-1)[0] = float("nan")  # type: ignore[arg-type]
        _check_grads(step, self.student, par)
        grad_norm = _grad_norm(self.student) if par is None else par.norm_of_grads(self.student)
        if settings.clip_grad_norm is not None and grad_norm > settings.clip_grad_norm:
            scale = settings.clip_grad_norm / (grad_norm + 1e-6)
            for p in self.student.parameters():
                if p.grad is not None:
                    p.grad.mul_(scale)
        self.optimizer.step()
        self.target.sync()
        return Update(value, summed, grad_norm, time.perf_counter() - began, measures)


def _check_loss(step: int, loss: torch.Tensor, terms: dict[str, torch.Tensor]) -> None:
    if bool(torch.isfinite(loss)):
        return
    culprit = next((name for name, t in terms.items() if not bool(torch.isfinite(t))), "loss")
    raise NonFiniteError(step, culprit, f"non-finite {culprit} at step {step}: {loss.item()}")


def _check_grads(step: int, model: torch.nn.Module, par: ParallelContext | None) -> None:
    """``NonFiniteError`` for a NaN/Inf gradient. Under FSDP2 each rank holds a piece of each gradient,
    so the ranks agree on the answer (every rank raises, none waits at the next collective)."""
    named = [(n, local_piece(p.grad)) for n, p in model.named_parameters() if p.grad is not None]
    # One device sync for the common, all-finite case; the culprit search only runs on failure.
    finite = not named or bool(torch.stack([torch.isfinite(g).all() for _, g in named]).all())
    if par is not None and par.is_sharded:
        finite = par.all_agree(finite)
    if finite:
        return
    name = next((n for n, g in named if not bool(torch.isfinite(g).all())), "a parameter on another rank")
    raise NonFiniteError(step, f"grad of {name}", f"non-finite gradient of {name} at step {step}")


def _grad_norm(model: torch.nn.Module) -> float:
    """The norm of every gradient together (what ``ParallelContext.norm_of_grads`` gives on one rank)."""
    parts = [p.grad.detach().double().square().sum() for p in model.parameters() if p.grad is not None]
    return float(torch.stack(parts).sum().item()) ** 0.5 if parts else 0.0


class RunFiles:
    """What the run writes besides checkpoints while it goes: ``config.yaml``, the tokenizer, the
    companion files of the model it started from (``companions``) and the metrics. ``hold``:
    ``train.overwrite``, the earlier run's files stay until this run's first checkpoint (``commit``)."""

    def __init__(
        self,
        out_dir: Path,
        config: Mapping[str, Any] | None,
        start: int,
        loggers: Sequence[str],
        hold: bool,
        tokenizer: Any = None,
        companions: Mapping[str, str] | None = None,
        model: str = "",
    ) -> None:
        self.out_dir, self.config, self.tokenizer = out_dir, config, tokenizer
        self.companions = dict(companions or {})
        self.config_file: Path | None = None
        self.tokenizer_file: Path | None = None
        self.metrics = MetricsLog(
            out_dir,
            start_step=start,
            trackers=loggers,
            hold=hold,
            name=f"{model}/{out_dir.name}" if model else out_dir.name,
            params=config,
        )
        self.held = hold
        if not hold:
            self._write_config()

    def _write_config(self) -> None:
        if self.config is not None:
            self.config_file = write_text_atomic(self.out_dir / "config.yaml", config_text(self.config))
        if self.tokenizer is not None:  # generate and export read it back (byte-level writes none)
            self.tokenizer_file = self.tokenizer.save(self.out_dir / TOKENIZER_FILE)
        for name, text in self.companions.items():  # train.init_from's: export keeps them
            write_text_atomic(self.out_dir / name, text)

    def commit(self) -> None:
        """The earlier run is gone (``train.overwrite``): this run's files now take its place."""
        self._write_config()
        self.metrics.commit()
        self.held = False

    def close(self) -> None:
        self.metrics.close()


@dataclass
class Loop:
    """The run as the loop sees it: one step (``stepper``), where its files go (``files``: the main
    rank's), the earlier run an overwrite replaces, what every checkpoint records (``meta``) and the
    notes for the user it adds to."""

    stepper: Stepper
    out_dir: Path
    par: ParallelContext | None
    files: RunFiles | None
    meta: dict[str, Any]
    earlier_run: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checkpoints: list[Path] = field(default_factory=list)
    evaluations: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    background: BackgroundWriter | None = None
    """``train.async_checkpoint``: where checkpoints are written while the steps go on."""

    def run(
        self, settings: TrainSettings, start: int, end: int, losses: list[float], on_event: OnEvent
    ) -> None:
        """Steps ``start + 1`` to ``end``, each loss appended to ``losses``."""
        began, written = time.perf_counter(), start
        with stopping.at_step_ends(), self._draining(settings):
            for step in range(start + 1, end + 1):
                stop = stopping.agreed_stop(self.par)
                if self.background is not None:
                    self._kept(settings, self.background.poll())
                if stop is not None:  # a signal: nothing lost, the step ended is kept (every rank agrees)
                    if step - 1 > written:
                        self._checkpoint(settings, step - 1)
                    raise stop
                record = self._step(settings, step, end, began)
                losses.append(record.loss)
                if self.files is not None:
                    self.files.metrics.record(record.metrics())
                on_event(record)
                every = settings.checkpoint_every
                if step == end or (every and step % every == 0):
                    self._checkpoint(settings, step)
                    written = step

    def _step(self, settings: TrainSettings, step: int, end: int, began: float) -> StepRecord:
        lr = lr_at(step, settings)
        done = self.stepper.update(settings, step, lr)
        task, evaluation = self.stepper.task, None
        every = settings.eval_every
        if task.is_language_model and (step == end or (every and step % every == 0)):
            found = task.evaluate(self.stepper.model, settings.eval_batches)
            if found is not None:
                evaluation = found.metrics()
                self.evaluations.append((step, evaluation))
        rate = settings.tokens / done.seconds if done.seconds > 0 else float("inf")
        return StepRecord(
            step,
            end,
            done.loss,
            done.terms,
            lr,
            done.seconds,
            rate,
            done.grad_norm,
            time.time(),
            time.perf_counter() - began,
            evaluation,
            done.measures,
        )

    def _checkpoint(self, settings: TrainSettings, step: int) -> None:
        meta = dict(self.meta)  # the loss history lives in metrics.jsonl, not in every checkpoint
        model, optimizer = self.stepper.student, self.stepper.optimizer
        if self.background is not None:  # the previous one sealed first, if it was still being written
            self._kept(settings, self.background.start(self.out_dir, step, model, optimizer, meta))
        else:
            self._kept(settings, checkpoint.save(self.par, self.out_dir, step, model, optimizer, meta))

    @contextlib.contextmanager
    def _draining(self, settings: TrainSettings) -> Iterator[None]:
        """The checkpoint being written in the background is complete when the steps end, however they
        end (an error in one process too: the last good state is kept; under torchrun a failing rank
        cannot take part in the collectives that would seal it)."""
        try:
            yield
        except BaseException:
            if self.background is not None and (self.par is None or not self.par.is_parallel):
                with contextlib.suppress(Exception):
                    self._kept(settings, self.background.finish())
            raise
        if self.background is not None:
            self._kept(settings, self.background.finish())

    def _kept(self, settings: TrainSettings, written: Path | None) -> None:
        """A complete checkpoint's bookkeeping: listed, an overwritten run's files removed, older ones
        pruned (``written`` None: another rank's, or none complete yet)."""
        if written is None:
            return
        self.checkpoints.append(written)
        if self.earlier_run:
            remove_previous_run(self.earlier_run, keep=[written])
            count = sum(p.suffix == ".safetensors" for p in self.earlier_run)
            self.notes.append(
                f"removed {count} checkpoint(s) of an earlier run in {self.out_dir} once this run's first "
                "checkpoint was written (train.overwrite=true)"
            )
            self.earlier_run = []
            if self.files is not None:
                self.files.commit()
        prune(self.out_dir, settings.keep_checkpoints, latest=written, run_sha256=self.meta["run_sha256"])


__all__ = ["Loop", "RunFiles", "Stepper", "Update"]
