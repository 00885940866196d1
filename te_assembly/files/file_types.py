"""What kind of file a path is, in words: te_assembly reads and writes regular files only.

Opening a FIFO for reading blocks until a writer comes and a device (``/dev/zero``) never ends, so a path
is checked for its type before it is opened, and the open file again after (``read.open_regular``).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from te_assembly.errors import OutputPathError


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


def not_regular(path: str | os.PathLike[str]) -> str | None:
    """What ``path`` is when it exists but is no regular file (``a FIFO (named pipe)``, ``a directory``,
    ...), else None (a regular file, or nothing there)."""
    try:
        return mode_kind(os.stat(path).st_mode)
    except OSError:
        return None


def check_regular(path: Path, what: str) -> None:
    """``OutputPathError`` when ``path`` exists and is no regular file (``not_regular``): a file
    te_assembly appends to or replaces."""
    kind = not_regular(path)
    if kind is not None:
        raise OutputPathError(f"{path} is {kind}, not a {what}: refusing to read or write it")


__all__ = ["check_regular", "mode_kind", "not_regular"]
