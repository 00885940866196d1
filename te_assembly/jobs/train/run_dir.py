"""A training run's directory: which one a run writes to, which checkpoint it resumes, and what an
overwrite may remove. Everything that decides what is in ``train.out_dir`` is here (the lock that
guards it is ``lock.py``), so runs never splice, overwrite or corrupt each other:

- ``choose``: the directory a run writes to. ``train.out_dir`` when set; ``train.resume=DIR`` (or a
  checkpoint in one): that run; otherwise the caller's ``RunPlace`` (the CLI's: Hydra's run directory,
  ``outputs/<model>/<date>_<time>``): a fresh one, or with ``train.resume=true`` the model's newest run
  that has checkpoints.
- ``resume_point``: the newest checkpoint whose every tensor matches its checksum. A corrupt or
  unreadable newest checkpoint stops the run (exit 1) with every problem and the exact way to resume
  from the newest good one (``train.resume_from=<path>``): nothing falls back silently. Resuming from
  an older checkpoint sets the corrupt newer files aside as ``<name>.corrupt`` (kept, never read).
- ``previous_run`` / ``remove_previous_run``: ``train.overwrite=true`` deletes the earlier run only once
  the new run has written (and verified) its first checkpoint; a run that fails before leaves it whole.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from te_assembly.errors import ArgumentError
from te_assembly.files.directory import check_run_directory
from te_assembly.files.write import prepare_out_dir
from te_assembly.formats.checkpoint import (
    CheckpointError,
    Found,
    name_step,
    newest_good,
    remove_entry,
    scan,
    verify,
)
from te_assembly.formats.companions import COMPANIONS
from te_assembly.jobs.train.settings import TrainSettings
from te_assembly.jobs.train.trackers import IDS_FILE, MLFLOW_STORE, TENSORBOARD_DIR, WANDB_DIR

RUN_FILES = (
    "metrics.jsonl",
    "loss_curve.png",
    "config.yaml",
    "losses.json",
    IDS_FILE,
    MLFLOW_STORE,
    *COMPANIONS,
)
"""Files a run writes next to its checkpoints (removed with them by ``train.overwrite=true``; the
TensorBoard event files under ``tensorboard/`` and W&B's ``wandb/`` too): its metrics, plot and config,
its trackers' ids and MLflow store (``trackers.py``), its tokenizer and the companions of the model it
started from (``formats.companions``). ``losses.json``: what runs before metrics.jsonl wrote."""
CORRUPT_SUFFIX = ".corrupt"


@dataclass(frozen=True)
class RunPlace:
    """Where the caller keeps runs when ``train.out_dir`` is not set (the CLI: Hydra's run directory)."""

    path: Path
    """This invocation's own directory."""
    claim: Callable[[], Path]
    """Makes (and returns) a fresh directory for a new run: ``path``, or a free one beside it."""
    named: bool = False
    """``path`` was named by hand (``hydra.run.dir``): a resume continues the run there."""
    runs_root: Path | None = None
    """Where this model's runs are kept: ``train.resume=true`` continues the newest one there."""
    model: str = "model"


def choose(settings: TrainSettings, place: RunPlace | None) -> tuple[TrainSettings, list[str]]:
    """The settings with ``out_dir`` set to the run's directory and ``resume`` a bool, and what to tell
    the user about the choice (module docstring)."""
    if settings.resume == AUTO:
        return _own_directory(settings, place)
    if settings.out_dir is not None:
        return dataclasses.replace(settings, resume=bool(settings.resume)), []
    if isinstance(settings.resume, str):
        return _continued(settings.resume, settings), []
    if place is None:
        raise ArgumentError(
            "train() writes into settings.out_dir: set it (the train command uses its run directory)"
        )
    if not settings.resume:
        return dataclasses.replace(settings, out_dir=str(place.claim())), []
    if place.named:  # hydra.run.dir named on the command line: that run
        return dataclasses.replace(settings, out_dir=str(place.path)), []
    chosen = Path(settings.resume_from).expanduser() if settings.resume_from else None
    if chosen is not None and chosen.is_file():  # a checkpoint by its path: its run
        return dataclasses.replace(settings, out_dir=str(chosen.parent)), []
    found = latest_run(place.runs_root, exclude=place.path)
    if found is not None:
        note = f"train.resume=true: continuing the newest run of {place.model} that has checkpoints, {found}"
        return dataclasses.replace(settings, out_dir=str(found)), [note]
    out = place.claim()
    where = place.runs_root or out.parent
    note = f"train.resume=true: no run of {place.model} with checkpoints in {where}; starting one in {out}"
    return dataclasses.replace(settings, out_dir=str(out)), [note]


AUTO = "auto"
"""``train.resume=auto``: this run's own directory, continued when it holds a checkpoint."""


def _own_directory(settings: TrainSettings, place: RunPlace | None) -> tuple[TrainSettings, list[str]]:
    """``train.resume=auto``: ``train.out_dir``, or the run directory the command names, continued from
    its newest good checkpoint when it has one (a restart) and started fresh otherwise (the first
    start); a default run directory is new, so a run in one starts fresh (and says how to name one)."""
    if settings.out_dir is not None:
        return dataclasses.replace(settings, resume=bool(scan(Path(settings.out_dir).expanduser()))), []
    if place is None:
        raise ArgumentError("train(resume='auto') continues settings.out_dir: set it")
    if place.named:
        return dataclasses.replace(settings, out_dir=str(place.path), resume=bool(scan(place.path))), []
    out = place.claim()
    note = (
        f"train.resume=auto: {out} is new, so the run starts fresh; for restarts that continue it, name "
        "the directory (hydra.run.dir=... or train.out_dir=...)"
    )
    return dataclasses.replace(settings, out_dir=str(out), resume=False), [note]


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


def out_dir_of(settings: TrainSettings, sources: Sequence[str] = ()) -> Path:
    """The run directory ``choose`` settled on, checked by the guarded writer (never one of the run's
    ``sources`` or inside one, never a directory written whole: ``check_run_directory``), created and
    probed for writing."""
    assert settings.out_dir is not None, "run_dir.choose sets out_dir first"
    check_run_directory(settings.out_dir, sources)
    return prepare_out_dir(settings.out_dir)


# --- resuming ------------------------------------------------------------------------------------


def _set_aside(path: Path) -> Path:
    target = path.with_name(path.name + CORRUPT_SUFFIX)
    n = 1
    while target.exists():
        target = path.with_name(f"{path.name}{CORRUPT_SUFFIX}.{n}")
        n += 1
    path.rename(target)
    return target


def _explicit(out_dir: Path, resume_from: str, found: list[Found]) -> tuple[Path, list[str]]:
    path = Path(resume_from).expanduser()
    if not path.is_absolute() and not path.exists():
        path = out_dir / path
    if path.resolve().parent != out_dir.resolve():
        raise CheckpointError(
            f"train.resume_from={resume_from} is not a checkpoint in train.out_dir ({out_dir}): a run "
            "continues in the directory its checkpoints are in"
        )
    chosen = verify(path)
    notes = [f"resuming from {path} (step {chosen.step}), as train.resume_from asks"]
    later: list[Found] = []
    broken: list[tuple[Found, str]] = []
    for f in found:
        if f.path.resolve() == path.resolve():
            continue
        if f.header is not None and f.header.step <= chosen.step:
            continue
        try:
            if f.header is not None:
                verify(f.path)
                later.append(f)
                continue
            problem = str(f.problem)
        except CheckpointError as exc:
            problem = str(exc)
        broken.append((f, problem))
    if later:
        # A resume never rolls back: the run's good checkpoints past this one would be rewritten.
        listed = ", ".join(f"{f.path.name} (step {f.step})" for f in later)
        raise CheckpointError(
            f"train.resume_from={resume_from} is step {chosen.step}, but this run has good checkpoints past "
            f"it: {listed}; resuming from it would overwrite them (a resume never rolls back). Resume from "
            "the newest (train.resume=true without resume_from), or, to branch from this step, copy "
            f"{path.name} into a new directory and resume there (train.resume=<that directory>)"
        )
    for f, problem in broken:
        notes.append(f"set aside {f.path} as {_set_aside(f.path).name}: {problem}")
    return path, notes


def resume_point(out_dir: Path, resume_from: str | None = None) -> tuple[Path | None, list[str]]:
    """The verified checkpoint to resume from (None: there is none, start at step 1) and notes.

    Raises ``CheckpointError`` when the newest checkpoint is corrupt or unreadable, naming each problem
    and the newest good checkpoint with the exact setting to resume from it."""
    found = scan(out_dir)
    if resume_from:
        return _explicit(out_dir, resume_from, found)
    good, problems, notes = newest_good(found)
    if problems:
        listed = "\n".join(f"  {p}" for p in problems)
        if good is None:
            raise CheckpointError(
                f"cannot resume: {out_dir} holds no good checkpoint:\n{listed}\n"
                "start over with train.resume=false train.overwrite=true, or use another train.out_dir"
            )
        raise CheckpointError(
            f"cannot resume from the newest checkpoint in {out_dir}:\n{listed}\n"
            f"the newest good checkpoint is {good.path} (step {good.step}, every tensor verified); to resume "
            f"from it, run again with train.resume=true train.resume_from={good.path}\n"
            "(the files above are left as they are; resuming from the good one sets them aside as "
            f"<name>{CORRUPT_SUFFIX})"
        )
    if good is None:
        return None, notes
    hinted = name_step(good.path)
    if hinted != good.step:
        notes.append(f"{good.path.name} holds step {good.step}: the step stored inside the file is used")
    return good.path, notes


def latest_run(root: Path | None, exclude: Path | None = None) -> Path | None:
    """The run directory under ``root`` (its sub-directories: ``outputs/<model>/<date>_<time>``) whose
    newest checkpoint-like file was written last, or None. A directory holding only unreadable
    checkpoint files counts too: resuming it then says what is wrong, instead of silently continuing an
    older run."""
    if root is None or not root.is_dir():
        return None
    best: tuple[float, str, Path] | None = None
    for folder in root.iterdir():
        if not folder.is_dir() or (exclude is not None and folder.resolve() == exclude.resolve()):
            continue
        found = scan(folder)
        if not found:
            continue
        newest = max((_mtime(f.path) for f in found), default=0.0)
        key = (newest, folder.name, folder)
        if best is None or key[:2] > best[:2]:
            best = key
    return best[2] if best is not None else None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


# --- starting over -------------------------------------------------------------------------------


def previous_run(out_dir: Path) -> list[Path]:
    """An earlier run's files: every checkpoint-like entry and the run files next to them."""
    entries = [f.path for f in scan(out_dir) if f.path.is_file() or f.path.is_symlink() or f.path.is_dir()]
    events = sorted((out_dir / TENSORBOARD_DIR).glob("events.out.tfevents.*"))
    wandb = [out_dir / WANDB_DIR] if (out_dir / WANDB_DIR).is_dir() else []
    return entries + [out_dir / name for name in RUN_FILES if (out_dir / name).is_file()] + events + wandb


def remove_previous_run(paths: Iterable[Path], keep: Iterable[Path]) -> list[Path]:
    """Delete ``paths`` except those in ``keep`` (what the new run has written under the same names)."""
    kept = {p.resolve() for p in keep}
    removed = []
    for p in paths:
        if p.resolve() in kept:
            continue
        if p.exists() or p.is_symlink():
            remove_entry(p)
            removed.append(p)
    return removed


__all__ = [
    "RunPlace",
    "choose",
    "latest_run",
    "out_dir_of",
    "previous_run",
    "remove_previous_run",
    "resume_point",
]
