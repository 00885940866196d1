"""The ``train`` job: a language model by next-token cross-entropy on text, any other model by
regressing a fixed random teacher of the same plan; checkpoints, resume, metrics, a clean stop.

In order: the settings decided for the task, every check that needs no tensor (the batch split, a
model without parameters, the memory estimate: once, for everything the run holds), the data read (a
language model's), the run's directory (``run_dir.choose``, checked by the guarded writer's
``check_run_directory``) and its lock probed, the lock taken, the models built, the checkpoint
restored, and the steps (``loop.py``, one step: ``step.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from te_assembly import display
from te_assembly.analysis.plan import Plan
from te_assembly.data.settings import DataSettings
from te_assembly.diagnostics import error
from te_assembly.engines.base import AssembledModel, loss_output_names
from te_assembly.engines.parallel.context import ParallelContext
from te_assembly.engines.target import Target, as_target
from te_assembly.errors import ConfigError
from te_assembly.formats.checkpoint import newest_good, remove_stale_temp, scan
from te_assembly.formats.checkpoint.background import BackgroundWriter
from te_assembly.jobs.events import Advanced, OnEvent, ignore
from te_assembly.jobs.train import stopping, trackers
from te_assembly.jobs.train.dpo import PreferenceTask
from te_assembly.jobs.train.lm_task import LanguageTask
from te_assembly.jobs.train.lock import RunLock, check_unlocked
from te_assembly.jobs.train.loop import Loop, RunFiles, Stepper
from te_assembly.jobs.train.result import Started, Stopped, TrainResult
from te_assembly.jobs.train.resume import decided_by_main, earlier_evaluations, restore, resume_from
from te_assembly.jobs.train.run_dir import RunPlace, choose, out_dir_of, previous_run
from te_assembly.jobs.train.run_record import check_fresh_start, record_sha256, run_record
from te_assembly.jobs.train.schedule import make_optimizer
from te_assembly.jobs.train.settings import TrainSettings
from te_assembly.jobs.train.task import TeacherTask, perturb_constant_parameters


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
        message = (
            f"train.batch_tokens={settings.tokens} does not split into train.grad_accum="
            f"{settings.grad_accum} micro-batches of {what}"
        )
        hint = f"use a train.batch_tokens that is a multiple of {settings.grad_accum * unit}"
        raise ConfigError([error("train.grad_accum", "partial-micro-batch", message, hint)])
    if plan.num_params == 0:
        message = f"{plan.name} has no parameters: there is nothing to train (run and bench work on it)"
        raise ConfigError([error("model", "nothing-to-train", message)])
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
        chunk_tokens=settings.loss_chunk_tokens if plan.takes_token_ids else None,
    )


def train(
    plan: Plan,
    target: Target | str,
    settings: TrainSettings,
    *,
    data: DataSettings | None = None,
    config: Mapping[str, Any] | None = None,
    place: RunPlace | None = None,
    on_event: OnEvent = ignore,
) -> TrainResult:
    """Train ``plan`` on ``target`` (a ``Target``, or an engine name): a language model (token ids in,
    logits out) by next-token cross-entropy on the text ``data`` names (default: ``DataSettings()``,
    the default corpus), any other model to regress a teacher built from the same plan with seed
    ``target.seed + settings.teacher_seed_offset``. The run writes into ``settings.out_dir``, or
    ``settings.resume``'s run, or a directory ``place`` gives (the CLI's run directories); ``config``,
    the invocation's resolved config, is written beside it as ``config.yaml``. ``on_event`` gets
    ``Started`` (the directory decided), ``Advanced`` (tokenizing), a ``StepRecord`` per step and
    ``Stopped`` (a signal ended the run, after its step and checkpoint).

    Raises, before anything is built: ``ConfigError`` for a model without parameters or a batch that
    does not split; ``ResourceError`` when teacher, student, optimizer and one batch's activations
    cannot fit in memory; ``OutputPathError`` when the directory cannot be written;
    ``RunDirectoryInUseError`` when another run holds it; ``ExistingRunError`` when it holds checkpoints
    and neither ``resume`` nor ``overwrite`` is set; ``CheckpointError`` when the checkpoint to resume
    is corrupt (naming the newest good one) or its run had other settings. While running:
    ``NonFiniteError`` (step, tensor name) when the loss, a gradient or (before a checkpoint is written)
    a parameter is NaN/Inf; ``CheckpointError`` when a checkpoint cannot be written (disk full...),
    every earlier file intact. A parallel target (under torchrun): every rank trains its slices on its
    rows of each batch (``batch_tokens`` is the whole batch); losses are means over ranks; rank 0
    alone writes.

    Besides checkpoints, the run directory gets ``metrics.jsonl`` (a record per step, as it goes), the
    trackers of ``settings.loggers`` (``trackers.py``; ``MissingToolError`` before anything starts for
    one not installed), ``config.yaml`` and, with ``settings.plot``, ``loss_curve.png``."""
    target = as_target(target)
    settings = settings.for_task(plan.takes_token_ids)
    check_can_train(plan, settings, target)
    par = target.parallel
    main = par is None or par.is_main
    loggers = trackers.resolve(settings.loggers) if main else ()
    # The data is read (every problem with it found) before a run directory is chosen or made: a run
    # that cannot start leaves nothing behind.
    language, data = _language(plan, target, settings, data, on_event)
    settings = _with_epochs(plan, settings, language)
    settings, notes = decided_by_main(par, lambda: choose(settings, place))
    if language is not None and language.epochs is not None:
        notes.insert(0, epochs_words(settings, language))
    out_dir = out_dir_of(settings, _sources(settings, data))
    check_unlocked(out_dir)  # every rank probes (shared probes never collide); the run locks it later
    check_fresh_start(out_dir, settings)
    if par is not None:
        par.barrier()  # every rank has probed before rank 0 takes the lock for the run
    on_event(Started(out_dir, tuple(notes)))
    try:
        with stopping.signals_stop(), RunLock(out_dir) if main else contextlib.nullcontext():
            return _locked(plan, target, settings, out_dir, language, data, config, loggers, on_event)
    except KeyboardInterrupt:
        if par is None or par.is_main:
            good, _, _ = newest_good(scan(out_dir))
            on_event(Stopped(out_dir, (good.path, good.step) if good is not None else None))
        raise


def _with_epochs(plan: Plan, settings: TrainSettings, language: LanguageTask | None) -> TrainSettings:
    """``train.epochs``: the steps of that many passes over the data (a language model's only)."""
    if settings.epochs is None:
        return settings
    if language is None:
        raise ConfigError(
            [
                error(
                    "train.epochs",
                    "not-a-language-model",
                    f"train.epochs counts passes over a language model's data; {plan.name} regresses a "
                    "teacher with fresh batches each step",
                    "set train.steps instead",
                )
            ]
        )
    return dataclasses.replace(settings, steps=language.steps_for(settings.epochs))


def _load_start(model: torch.nn.Module, settings: TrainSettings) -> None:
    """``train.init_from``'s weights into ``model`` (as built, from the seed, without one)."""
    if settings.init_from is not None:
        from te_assembly.formats.pretrained import load_pretrained_weights

        load_pretrained_weights(model, settings.init_from)  # type: ignore[arg-type]


def _objective_fits(settings: TrainSettings, data: DataSettings, target: Target) -> None:
    """``train.objective=dpo`` and ``data.format=preference`` go together, on one process."""
    dpo, pairs = settings.objective == "dpo", data.format == "preference"
    problems = []
    if dpo != pairs:
        problems.append(
            error(
                "train.objective" if pairs else "data.format",
                "conflicting-settings",
                "train.objective=dpo trains on preference pairs: data.format=preference with it, and only "
                "with it",
                "train.objective=dpo data.format=preference",
            )
        )
    if dpo and data.packing:
        problems.append(
            error(
                "data.packing",
                "conflicting-settings",
                "data.packing packs text or conversations; preference pairs (train.objective=dpo) are "
                "not packed",
            )
        )
    if dpo and target.parallel is not None:
        problems.append(
            error(
                "train.objective",
                "conflicting-settings",
                "train.objective=dpo runs on one process (not under torchrun) for now",
            )
        )
    if problems:
        raise ConfigError(problems)


def epochs_words(settings: TrainSettings, language: LanguageTask) -> str:
    corpus = language.corpus
    return (
        f"train.epochs={settings.epochs:g}: {settings.steps} steps of {language.sequences} sequences over "
        f"{corpus.units} {corpus.unit_words} (train.steps is not read)"
    )


def _language(
    plan: Plan, target: Target, settings: TrainSettings, data: DataSettings | None, on_event: OnEvent
) -> tuple[LanguageTask | None, DataSettings | None]:
    """A language model's task with its data (default: ``DataSettings()``) read and tokenized, held to
    the tokenizer ``train.init_from``'s model was trained with; (None, data) for any other model."""
    if not plan.takes_token_ids:
        return None, data
    data = data if data is not None else DataSettings()
    if settings.init_from is not None:
        data = _with_init_tokenizer(data, Path(settings.init_from).expanduser())
    _objective_fits(settings, data, target)
    language: LanguageTask
    if settings.objective == "dpo":
        from te_assembly.data.preference import PreferenceCorpus

        pairs = PreferenceCorpus.prepare(data, settings.positions)
        language = PreferenceTask(
            plan,
            pairs,
            target,
            tokens=settings.tokens,
            dpo=settings.dpo,
            chunk_tokens=settings.loss_chunk_tokens,
        )
    else:
        language = LanguageTask.prepare(
            plan,
            data,
            target,
            tokens=settings.tokens,
            seq_len=settings.positions,
            z_loss=settings.z_loss,
            mtp_weight=settings.mtp_weight,
            chunk_tokens=settings.loss_chunk_tokens,
            progress=lambda done, total: on_event(Advanced("tokenize", done, total, "tokenizing")),
        )
    if settings.init_from is not None:
        from te_assembly.formats.tokenizer_record import check_tokenizer

        check_tokenizer(Path(settings.init_from).expanduser(), language.corpus.tokenizer, "train.init_from")
    return language, data


def _with_init_tokenizer(data: DataSettings, folder: Path) -> DataSettings:
    """``data`` tokenized with ``train.init_from``'s own ``tokenizer.json`` (its end-of-text token, or its
    ``eos_token``) when ``data.tokenizer`` names none: a model fine-tuned reads text as it was trained to."""
    from te_assembly.data.chat import model_tokenizer

    path = folder / "tokenizer.json"
    if data.tokenizer.kind != "byte" or not path.is_file():
        return data
    tokenizer = model_tokenizer(path, data.tokenizer.eot, within=folder)
    chosen = dataclasses.replace(data.tokenizer, path=str(path), eot=tokenizer.eot)
    return dataclasses.replace(data, tokenizer=chosen)


def _companions(settings: TrainSettings) -> dict[str, str]:
    """``train.init_from``'s companion files (its source ``config.json``, generation config, tokenizer
    configuration), kept in the run so an export of it keeps them; the run's own tokenizer is its data's
    (held to the same one)."""
    if settings.init_from is None:
        return {}
    from te_assembly.formats.companions import TOKENIZER_FILE, read_companions

    found = read_companions(Path(settings.init_from).expanduser())
    return {name: text for name, text in found.items() if name != TOKENIZER_FILE}


def _sources(settings: TrainSettings, data: DataSettings | None) -> list[str]:
    """What the run reads, which its directory must neither be nor be inside."""
    paths = [settings.init_from]
    if data is not None:
        glob_free = data.path is not None and not any(c in data.path for c in "*?[")
        paths += [data.path if glob_free else None, data.tokenizer.path]
    return [str(Path(p).expanduser()) for p in paths if p is not None]


def _locked(
    plan: Plan,
    target: Target,
    settings: TrainSettings,
    out_dir: Path,
    language: LanguageTask | None,
    data: DataSettings | None,
    config: Mapping[str, Any] | None,
    loggers: tuple[str, ...],
    on_event: OnEvent,
) -> TrainResult:
    par = target.parallel
    main = par is None or par.is_main
    notes, resume_path, earlier_run = _directory_now(out_dir, settings, par)
    stepper = _stepper(plan, target, settings, language, par)
    run = run_record(
        settings,
        plan=plan,
        seed=target.seed,
        engine=target.engine,
        kernels=target.kernels,
        dtype=target.dtype,
        recipe=target.recipe,
        data=language.record(data) if language is not None and data is not None else None,
    )
    losses: list[float] = []
    start = 0
    if par is not None:
        par.barrier()  # every rank has read the directory before rank 0 changes anything in it
    adapters = bool(plan.adapter_params)
    # A frozen base is loaded on a resume too: the checkpoints hold only the adapters.
    if settings.init_from is not None and (resume_path is None or adapters):
        from te_assembly.formats.pretrained import load_pretrained_weights

        load_pretrained_weights(stepper.student, settings.init_from)  # type: ignore[arg-type]
        if resume_path is None:
            notes.append(f"started from the weights of {settings.init_from}")
    if adapters:
        run["base"] = base_record(stepper.student, settings, par)
    if isinstance(language, PreferenceTask):  # its reference: the starting weights, before a resume's
        language.attach(stepper.student, adapters, lambda frozen: _load_start(frozen, settings))
    if resume_path is not None:
        start, losses = restore(par, resume_path, stepper.student, stepper.optimizer, run, settings, notes)
    elif settings.resume:
        notes.append(f"no checkpoint in {out_dir}: starting from step 1")
    end = min(settings.steps, settings.stop_after or settings.steps)
    if start >= end:
        notes.append(f"nothing to do: already at step {start} (train.steps={settings.steps})")
    tokenizer = language.corpus.tokenizer if language is not None else None
    companions = _companions(settings) if resume_path is None else {}
    files = (
        RunFiles(out_dir, config, start, loggers, bool(earlier_run), tokenizer, companions, plan.name)
        if main
        else None
    )
    loop = Loop(stepper, out_dir, par, files, _meta(plan, target, settings, run), earlier_run, notes)
    if settings.async_checkpoint:
        loop.background = BackgroundWriter(par if par is not None else ParallelContext.single(plan))
    if main and stepper.task.is_language_model:
        loop.evaluations = earlier_evaluations(out_dir, start)
    try:
        loop.run(settings, start, end, losses, on_event)
    finally:
        if files is not None:
            files.close()
    return _result(plan, target, out_dir, loop, losses, start, end, main, settings.plot)


def base_record(
    model: torch.nn.Module, settings: TrainSettings, par: ParallelContext | None
) -> dict[str, Any]:
    """What a run with adapters records of its frozen base: where it came from (``train.init_from``, as
    an absolute path, or none: the seed's weights) and the SHA-256 of its global tensors, so adapters
    are never resumed, exported or loaded onto another base."""
    from te_assembly.formats.pretrained import base_digest, expected_shapes

    plan: Plan = model.plan  # type: ignore[assignment]
    rename = par.local_to_global if par is not None else {}
    base = (
        set(expected_shapes(plan)) - plan.adapter_params
    )  # the saved weights (tied ones once), not TE's extra state
    named = {rename.get(k, k): v for k, v in model.state_dict().items()}
    frozen = {k: v for k, v in named.items() if k in base and isinstance(v, torch.Tensor)}
    if par is not None and par.is_parallel:
        gathered = par.gather_global(frozen)
        digest = par.from_main(base_digest(gathered) if gathered is not None else None)
    else:
        digest = base_digest(frozen)
    origin = str(Path(settings.init_from).expanduser().resolve()) if settings.init_from is not None else None
    return {"init_from": origin, "sha256": digest}


def _directory_now(
    out_dir: Path, settings: TrainSettings, par: ParallelContext | None
) -> tuple[list[str], Path | None, list[Path]]:
    """Under the lock: the fresh-start check again, stale temp files gone, the checkpoint to resume and
    (``train.overwrite``) the earlier run's files, which stay whole until this run has a verified
    checkpoint. Rank 0 alone touches the directory."""
    main = par is None or par.is_main
    check_fresh_start(out_dir, settings)
    notes = [f"removed stale temp file {p}" for p in remove_stale_temp(out_dir)] if main else []
    resume_path = None
    if settings.resume:
        resume_path, found_notes = resume_from(par, out_dir, settings)
        notes.extend(found_notes)
    earlier_run = previous_run(out_dir) if settings.overwrite and main else []
    return notes, resume_path, earlier_run


def _meta(plan: Plan, target: Target, settings: TrainSettings, run: dict[str, Any]) -> dict[str, Any]:
    """What every checkpoint of the run records besides its state."""
    return {
        "plan": plan.name,
        "seed": target.seed,
        "planned_steps": settings.steps,
        "engine": target.engine,
        "run": run,
        "run_sha256": record_sha256(run),
        "settings": dataclasses.asdict(settings),
    }


def _stepper(
    plan: Plan,
    target: Target,
    settings: TrainSettings,
    language: LanguageTask | None,
    par: ParallelContext | None,
) -> Stepper:
    """The student (wrapped for a parallel run), its optimizer and its task (the teacher built first:
    the student's weights are the same with and without one)."""
    task: TeacherTask | LanguageTask
    if language is not None:
        task = language
    else:
        teacher = target.build(plan, seed=target.seed + settings.teacher_seed_offset, split=False)
        perturb_constant_parameters(teacher)
        task = TeacherTask(plan, teacher, target, tokens=settings.tokens, seq_len=settings.positions)
    student = target.build(plan, seed=target.seed, activation_checkpointing=settings.activation_checkpointing)
    student.train()
    model = par.wrap(student) if par is not None else student
    optimizer = make_optimizer(student.parameters(), settings)
    return Stepper(student, model, optimizer, task, loss_output_names(plan), target, par)


def _result(
    plan: Plan,
    target: Target,
    out_dir: Path,
    loop: Loop,
    losses: list[float],
    start: int,
    end: int,
    main: bool,
    plot: bool,
) -> TrainResult:
    student: AssembledModel = loop.stepper.student  # type: ignore[assignment]
    result = TrainResult(
        model_name=plan.name,
        engine=student.engine,
        language_model=loop.stepper.task.is_language_model,
        out_dir=out_dir,
        losses=losses,
        start_step=start,
        last_step=max(start, end),
        is_main=main,
        checkpoints=loop.checkpoints,
        notes=loop.notes,
        model=student,
        evaluations=loop.evaluations,
        files_held=bool(loop.earlier_run),
    )
    files = loop.files
    if files is not None and not loop.earlier_run:
        result.metrics_file = files.metrics.path
        result.config_file = files.config_file
        result.tokenizer_file = files.tokenizer_file
        result.trackers = files.metrics.tracker_names
    if plot:
        display.views().draw_run(result)  # the picture is a view (views/loss_curve.py)
    return result


__all__ = ["check_can_train", "train"]
