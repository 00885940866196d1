"""Output directories and the files in them: made and probed before any work (a path that cannot take
files fails at once with a typed error instead of a traceback after the work is done), and written
atomically with the permissions any file of the user gets.

Pure Python (no torch): ``graph`` and the config writer use it; checkpoints build on ``create_temp``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
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


def write_text_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to a temp file next to ``path``, fsync it, rename it over ``path``: a reader sees
    the old file or the new one, never half of one. ``OutputPathError`` when it cannot be written
    (``path`` is then left as it was)."""
    tmp = ""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = create_temp(path)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise write_error(path, exc) from None
    fsync_dir(path.parent)
    return path


__all__ = ["create_temp", "file_mode", "fsync_dir", "prepare_out_dir", "write_error", "write_text_atomic"]
