"""A training run's directory: where its files live, who may touch them, and which checkpoint to resume.

Everything that decides or changes what is in ``train.out_dir`` is here, so runs never splice,
overwrite or corrupt each other:

- ``RunLock``: an exclusive ``fcntl.flock`` on ``<out_dir>/.te_assembly.lock``, taken before anything
  in the directory is read or changed and held until the run ends. The holder writes its pid, host,
  start time and command into the file, so a refused run says who holds it. The kernel releases a flock
  when its process dies (even by ``kill -9``), so a crash never leaves a stale lock; a run that ends
  removes the file while it still holds it (a finished run leaves none behind). Stale temp files
  are removed only under the lock: a live run's temp file is never another process's garbage.
- ``resume_point``: the newest checkpoint whose every tensor matches its checksum. A corrupt or
  unreadable newest checkpoint stops the run (exit 1) with every problem and the exact way to resume
  from the newest good one (``train.resume_from=<path>``): nothing falls back silently. Resuming from
  an older checkpoint sets the corrupt newer files aside as ``<name>.corrupt`` (kept, never read).
- ``previous_run`` / ``remove_previous_run``: ``train.overwrite=true`` deletes the earlier run only once
  the new run has written (and verified) its first checkpoint; a run that fails before leaves it whole.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from te_assembly.errors import RunDirectoryInUseError
from te_assembly.jobs.training.checkpoint import (
    CheckpointError,
    Found,
    Header,
    name_step,
    remove_entry,
    scan,
    verify,
)
from te_assembly.outputs import not_regular, prepare_out_dir

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: runs are not locked (documented)
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".te_assembly.lock"
RUN_FILES = ("metrics.jsonl", "loss_curve.png", "config.yaml", "losses.json")
"""Files a run writes next to its checkpoints (removed with them by ``train.overwrite=true``; the
TensorBoard event files under ``tensorboard/`` too). ``losses.json``: what runs before metrics.jsonl
wrote."""
TENSORBOARD_DIR = "tensorboard"
CORRUPT_SUFFIX = ".corrupt"


def out_dir_of(settings: Any) -> Path:
    """The run directory for ``settings`` (a ``TrainSettings``), created and probed for writing: the one
    place that decides where a run's files go."""
    return prepare_out_dir(settings.out_dir)


def _holder() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(sys.argv)[:500],
    }


def _describe_holder(raw: str) -> str:
    try:
        info = json.loads(raw)
        return (
            f"pid {int(info['pid'])} on host {info['host']!r}, started {info['started']} "
            f"({ascii(str(info.get('command', '')))[1:-1] or 'command unknown'})"
        )
    except (ValueError, KeyError, TypeError):
        return "another process (its details could not be read)"


class RunLock:
    """``with RunLock(out_dir):`` — exclusive use of a run directory, or ``RunDirectoryInUseError``."""

    def __init__(self, out_dir: Path, shared: bool = False) -> None:
        self.out_dir = out_dir
        self.path = out_dir / LOCK_NAME
        self.shared = shared
        """A shared lock only probes (``check_unlocked``): it records no holder."""
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        if fcntl is None:
            return self
        # A holder removes the file when it is done (release): a process that opened the old file just
        # before locks a file that no longer is the lock, sees so, and tries again on the new one.
        for _ in range(_ATTEMPTS):
            fd = self._open()
            if fd is None:  # a probe of a directory no run holds (no lock file): nothing to check
                return self
            try:
                _flock_briefly(fd, fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise RunDirectoryInUseError(
                    f"{self.out_dir} is in use by another training run: {holder}. Two runs never share a "
                    "directory: wait for it to finish, or use another train.out_dir"
                ) from None
            except OSError as exc:  # a filesystem without locks: refusing is safer than running unguarded
                os.close(fd)
                raise RunDirectoryInUseError(
                    f"cannot lock {self.path}: {exc.strerror or exc} (does this filesystem support file "
                    "locks?); use a train.out_dir on a local disk"
                ) from None
            if not _is_the_file(fd, self.path):
                os.close(fd)
                continue
            if not self.shared:
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(_holder()).encode(), 0)
            self._fd = fd
            return self
        raise RunDirectoryInUseError(f"cannot lock {self.out_dir}: its lock file keeps being replaced")

    def _open(self) -> int | None:
        kind = not_regular(self.path)
        if kind is not None:
            message = f"cannot lock {self.out_dir}: {self.path} is {kind}, not a lock file"
            raise RunDirectoryInUseError(message)
        flags = os.O_RDWR if self.shared else os.O_RDWR | os.O_CREAT
        try:
            return os.open(self.path, flags, 0o666)  # less the umask
        except FileNotFoundError:
            if self.shared:
                return None
            raise RunDirectoryInUseError(f"cannot lock {self.path}: its directory does not exist") from None
        except OSError as exc:
            raise RunDirectoryInUseError(f"cannot lock {self.path}: {exc.strerror or exc}") from None

    def release(self) -> None:
        if self._fd is not None:
            # Removed while still held, so a finished run leaves no lock file; whoever waits on this
            # file finds it gone once it gets the lock and takes the new one (acquire). A probe's shared
            # lock leaves the file to the holder.
            if not self.shared and _is_the_file(self._fd, self.path):
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
            os.close(self._fd)  # releases the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


_ATTEMPTS = 50


def _is_the_file(fd: int, path: Path) -> bool:
    """``fd`` is the file at ``path`` now (not one a holder has removed since it was opened)."""
    try:
        now = os.stat(path)
    except OSError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (now.st_dev, now.st_ino)


def _flock_briefly(fd: int, kind: int, patience_s: float = 0.5) -> None:
    """``flock`` without blocking for long: a probe (``check_unlocked``) holds the lock for microseconds,
    so a few retries tell it apart from a run that holds it; ``BlockingIOError`` after that."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


def _read_holder(fd: int) -> str:
    # The holder writes its details just after it locks: a reader that comes in between retries.
    for _ in range(5):
        with contextlib.suppress(OSError):
            raw = os.pread(fd, 4096, 0).decode(errors="replace")
            if raw.strip():
                return _describe_holder(raw)
        time.sleep(0.05)
    return "another process (its details could not be read)"


def check_unlocked(out_dir: Path) -> None:
    """Raise ``RunDirectoryInUseError`` now if another run holds ``out_dir``. A shared lock, taken and
    dropped at once: probes never exclude each other (every rank of a job may probe at the same time),
    only a run holding the exclusive lock refuses them."""
    RunLock(out_dir, shared=True).acquire().release()


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


def newest_good(found: list[Found]) -> tuple[Header | None, list[str], list[str]]:
    """The newest checkpoint of ``found`` (``scan``) that verifies, the problems of every newer or
    unreadable one, and notes on older unreadable ones (ignored)."""
    problems: list[str] = []
    good = None
    for f in reversed([f for f in found if f.header is not None]):
        try:
            good = verify(f.path)
            break
        except CheckpointError as exc:
            problems.append(str(exc))
    notes: list[str] = []
    for f in found:
        if f.header is None:
            hinted = name_step(f.path)
            if good is not None and hinted is not None and hinted < good.step:
                notes.append(f"ignored {f.path} (older than step {good.step}): {f.problem}")
            else:
                problems.append(str(f.problem))
    return good, problems, notes


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
    return entries + [out_dir / name for name in RUN_FILES if (out_dir / name).is_file()] + events


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
    "LOCK_NAME",
    "RunLock",
    "check_unlocked",
    "latest_run",
    "out_dir_of",
    "previous_run",
    "remove_previous_run",
    "resume_point",
]
