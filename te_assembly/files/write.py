"""The one atomic file writer: a file is written to a temp file beside it, fsynced, checked, then
renamed over its name, so a reader (or a crash) sees the old file or the new one, never half of one. New
files get the permissions any file of the user gets (``0o666`` less the umask), and a directory that
cannot take files fails at once (``prepare_out_dir``) instead of after the work.

Pure Python (no torch): ``graph`` and the config writer use it; checkpoints build on ``create_temp``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path

from te_assembly.errors import OutputPathError

TEMP_SUFFIX = ".tmp"


def prepare_out_dir(path: str | Path) -> Path:
    """Create ``path`` (with parents) and check a file can be written in it; raise ``OutputPathError``."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise OutputPathError(f"cannot write to {out}: it exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        # mkdir can succeed where files cannot be created (read-only mounts, /proc, /sys): write one.
        with tempfile.NamedTemporaryFile(dir=out, prefix=".te_assembly-probe-"):
            pass
    except OSError as exc:
        raise OutputPathError(f"cannot write to {out}: {exc.strerror or exc}") from None
    return out


def write_error(path: Path, exc: OSError) -> OutputPathError:
    """The typed error for a failed write of ``path``."""
    return OutputPathError(f"cannot write to {path}: {exc.strerror or exc}")


def create_temp(path: Path, suffix: str = TEMP_SUFFIX) -> tuple[int, str]:
    """A new, empty, hidden temp file next to ``path`` (an open fd and its name), created with the
    permissions any file of the user gets: ``0o666`` less the umask. (``tempfile.mkstemp`` makes
    ``0o600``, and renaming the temp file over ``path`` would keep that.)"""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}{suffix}"
        try:
            return os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666), str(tmp)
        except FileExistsError:
            continue
    raise FileExistsError(f"cannot create a temp file next to {path}")


def file_mode() -> int:
    """The mode a new file of this user gets: ``0o666`` less the umask. Read from ``/proc`` where it
    is there (reading it with ``os.umask`` means setting it for a moment, which another thread creating
    a file could see)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable; not every platform can open a directory."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _os_problem(exc: BaseException) -> str | None:
    return (exc.strerror or str(exc)) if isinstance(exc, OSError) else None


def write_atomic(
    path: Path,
    write: Callable[[str], object],
    check: Callable[[str], object] | None = None,
    *,
    problem_of: Callable[[BaseException], str | None] = _os_problem,
    error: Callable[[Path, str], Exception] | None = None,
) -> Path:
    """Call ``write(temp_path)`` for a temp file next to ``path``, fsync it, run ``check(temp_path)``, then
    rename it over ``path``: a reader sees the old file or the new one, never half of one. On any failure
    the temp file is removed and ``path`` is left as it was. A failed write (``problem_of`` gives its
    one-line reason; default: an ``OSError``) is raised as ``error(path, reason)``, by default
    ``OutputPathError``; anything else propagates as it is. Returns ``path``."""
    tmp = ""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = create_temp(path)
        os.close(fd)
        write(tmp)
        # A writer may replace the temp file with its own (safetensors writes one of mode 0o600 and
        # renames it): give it the mode any new file of the user gets.
        os.chmod(tmp, file_mode())
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        if check is not None:
            check(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        problem = problem_of(exc)
        if problem is not None:
            raise (error or _output_error)(path, problem) from exc
        raise
    fsync_dir(path.parent)
    return path


def _output_error(path: Path, problem: str) -> Exception:
    return OutputPathError(f"cannot write to {path}: {problem}")


def write_text_atomic(path: Path, text: str) -> Path:
    """``text`` written to ``path`` atomically (``write_atomic``); ``OutputPathError`` when it cannot be."""
    return write_atomic(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


__all__ = [
    "TEMP_SUFFIX",
    "create_temp",
    "file_mode",
    "fsync_dir",
    "prepare_out_dir",
    "write_atomic",
    "write_error",
    "write_text_atomic",
]
