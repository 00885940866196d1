"""A run directory's lock: an exclusive ``fcntl.flock`` on ``<out_dir>/.te_assembly.lock``, taken before
anything in the directory is read or changed and held until the run ends.

The holder writes its pid, host, start time and command into the file, so a refused run says who
holds it. The kernel releases a flock when its process dies (even by ``kill -9``), so a crash never
leaves a stale lock; a run that ends removes the file while it still holds it (a finished run leaves
none behind). Stale temp files are removed only under the lock: a live run's temp file is never
another process's garbage.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from te_assembly.errors import RunDirectoryInUseError
from te_assembly.files.file_types import not_regular

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: runs are not locked (documented)
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".te_assembly.lock"


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


__all__ = ["LOCK_NAME", "RunLock", "check_unlocked"]
