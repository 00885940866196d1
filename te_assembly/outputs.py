"""Output directories and the files in them: made and probed before any work (a path that cannot take
files fails at once with a typed error instead of a traceback after the work is done), and written
atomically with the permissions any file of the user gets.

Pure Python (no torch): ``graph`` and the config writer use it; checkpoints build on ``create_temp``.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import secrets
import stat
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from te_assembly.errors import OutputPathError
from te_assembly.version import __version__

TEMP_SUFFIX = ".tmp"


def not_regular(path: str | Path) -> str | None:
    """What ``path`` is when it exists but is no regular file (``a FIFO (named pipe)``, ``a directory``,
    ...), else None: opening a FIFO for reading blocks until a writer comes, so files te_assembly reads or
    appends to are checked first, and refused by name."""
    try:
        return mode_kind(os.stat(path).st_mode)
    except OSError:
        return None


def mode_kind(mode: int) -> str | None:
    """What a file of ``mode`` (``st_mode``) is, in words, when it is no regular file; None when it is."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def check_regular(path: Path, what: str) -> None:
    """``OutputPathError`` when ``path`` exists and is no regular file (``not_regular``)."""
    kind = not_regular(path)
    if kind is not None:
        raise OutputPathError(f"{path} is {kind}, not a {what}: refusing to read or write it")


RUN_MARKERS = (".te_assembly.lock", "ckpt-*.safetensors", "model.safetensors")
"""Files that make a directory a training run's (its lock, its checkpoints) or a pretrained model's."""


def holds_a_run(directory: Path) -> bool:
    """Does ``directory`` hold a training run or a pretrained model (``RUN_MARKERS``)?"""
    return directory.is_dir() and any(any(directory.glob(marker)) for marker in RUN_MARKERS)


def check_not_a_run(directory: Path, what: str) -> None:
    """``OutputPathError`` when ``directory`` holds another run's files: ``what`` (a command's outputs)
    never goes where a training run or a pretrained model lives."""
    if holds_a_run(directory):
        raise OutputPathError(
            f"{directory} holds a training run or a pretrained model (its lock, checkpoints or weights): "
            f"{what} never writes into it; choose another directory"
        )


def check_not_theirs(path: Path, what: str) -> None:
    """``OutputPathError`` when ``path`` exists and is not a file te_assembly writes for ``what``: a
    checkpoint or weights file (``.safetensors``), or a ``config.yaml`` te_assembly did not write (a
    user's own config)."""
    if not path.exists():
        return
    if path.suffix == ".safetensors":
        raise OutputPathError(f"{path} is a checkpoint or weights file: {what} never writes over it")
    if path.name == "config.yaml":
        with contextlib.suppress(OSError):
            head = path.read_text(encoding="utf-8", errors="replace")[:40]
            if head and not head.startswith("# te_assembly"):
                raise OutputPathError(
                    f"{path} is not a config te_assembly wrote (yours?): {what} never writes over it; "
                    "choose another directory"
                )


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


def config_text(config: Mapping[str, Any], command_line: str | None = None) -> str:
    """A resolved config as YAML, with a header saying when and, if given, by which command line it was
    made: the ``config.yaml`` beside a run's results."""
    when = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    lines = [f"# te_assembly {__version__}: the fully resolved config of this run ({when})"]
    if command_line is not None:
        lines.append(f"# {command_line}")
    lines.append("# model and recipe as read (overrides and interpolations applied), then every setting")
    body = yaml.safe_dump(dict(config), sort_keys=False, allow_unicode=True, default_flow_style=False)
    return "\n".join(lines) + "\n" + body


__all__ = [
    "RUN_MARKERS",
    "check_not_a_run",
    "check_not_theirs",
    "check_regular",
    "config_text",
    "create_temp",
    "file_mode",
    "fsync_dir",
    "holds_a_run",
    "mode_kind",
    "not_regular",
    "prepare_out_dir",
    "write_atomic",
    "write_error",
    "write_text_atomic",
]
