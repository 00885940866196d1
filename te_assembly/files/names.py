"""The one path sanitiser: a name that becomes a file or folder name, and whether a path stays inside
the folder it was given in.

A name from a config or a checkpoint (``import_hf.name``, a model's name, ``cp``'s destination) is used
as one path component, never as a path: ``name_problem`` refuses separators, ``..``, ``.``, a leading
``-`` or ``.``, control characters, NUL and names longer than a file system takes, so nothing it names
can land outside the folder the command writes into.
"""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path

from te_assembly.errors import ArgumentError

MAX_NAME_BYTES = 200
"""Longest name in UTF-8 bytes: file systems take 255, and te_assembly adds suffixes (``_layer.yaml``,
``.<token>.saving``) to some names."""


def name_problem(name: object) -> str | None:
    """Why ``name`` cannot be used as one file or folder name, in words; None when it can."""
    if not isinstance(name, str):
        return f"a name is text, not {type(name).__name__}"
    if not name:
        return "the name is empty"
    if name in (".", ".."):
        return f"{name!r} names a folder, not a new file"
    for sep in {"/", "\\", os.sep, os.altsep or "/"}:
        if sep in name:
            return f"{sep!r} would make it a path"
    for char in name:
        if char == "\0" or unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp"):
            return f"it holds a control character ({char!a})"
    if name[0] in ".-":
        return f"it starts with {name[0]!r} (a hidden file, or an option to other tools)"
    if name != name.strip():
        return "it starts or ends with white space"
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        return f"it is {len(name.encode('utf-8'))} bytes long; names are limited to {MAX_NAME_BYTES}"
    return None


def as_file_name(text: str, fallback: str, allowed: str = r"A-Za-z0-9_.+-") -> str:
    """``text`` made into one safe file or folder name (for names te_assembly derives, where refusing
    would help no one: a run directory named after a model file, an imported model named after its
    folder): every character outside ``allowed`` becomes ``_``, leading dots and dashes go, and it is
    cut to ``MAX_NAME_BYTES``; ``fallback`` when nothing is left. Always passes ``name_problem``."""
    cleaned = re.sub(f"[^{allowed}]", "_", text).lstrip(".-").rstrip(".")
    cleaned = cleaned.encode("utf-8")[:MAX_NAME_BYTES].decode("utf-8", "ignore").strip()
    return cleaned if cleaned and name_problem(cleaned) is None else fallback


def safe_name(name: object, what: str) -> str:
    """``name`` when it can be one file or folder name; ``ArgumentError`` saying why not (``what``: the
    setting or argument it came from, for the message)."""
    problem = name_problem(name)
    if problem is not None:
        raise ArgumentError(f"{what}={name!r} cannot be a file name: {problem}")
    assert isinstance(name, str)
    return name


def inside(path: str | os.PathLike[str], folder: str | os.PathLike[str]) -> bool:
    """Whether ``path``, every symlink resolved, is ``folder`` (resolved) or below it."""
    try:
        real, root = Path(path).resolve(), Path(folder).resolve()
    except (OSError, RuntimeError):  # a symlink loop
        return False
    return real == root or root in real.parents


def overlap(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> str | None:
    """How ``a`` and ``b`` (resolved) overlap: ``"is"``, ``"inside"`` (``a`` below ``b``), ``"contains"``
    (``b`` below ``a``), or None."""
    try:
        ra, rb = Path(a).resolve(), Path(b).resolve()
    except (OSError, RuntimeError):
        return None
    if ra == rb:
        return "is"
    if rb in ra.parents:
        return "inside"
    if ra in rb.parents:
        return "contains"
    return None


__all__ = ["MAX_NAME_BYTES", "as_file_name", "inside", "name_problem", "overlap", "safe_name"]
