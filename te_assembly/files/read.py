"""The one bounded reader: every file a user can point at (configs, ``config.json`` and the other JSON
of a checkpoint, tokenizer files, prompt files, data files) is read through here.

- Regular files only: a FIFO, a device (``/dev/zero``), a socket or a directory is refused by its type
  before it is opened, and the open file is checked again (opened non-blocking, so a file swapped for a
  FIFO in between cannot block either).
- A size limit per kind of file (``LIMITS``), checked on the open file and again while reading (a file
  that grows, or lies about its size as ``/proc`` files do, stops at the limit).
- ``within``: the folder a file was found in. The path, every symlink resolved, must stay inside it; a
  symlink out of a checkpoint or a data folder is refused, naming where it points. A snapshot of the
  Hugging Face cache may lead to its own repository's ``blobs/``, where huggingface_hub keeps its files.
- UTF-8 errors name the byte and the line; JSON is parsed with a depth limit, duplicate keys refused.

Every problem is an ``InputFileError`` (or the caller's own error type, ``make_error=``) whose ``code`` is a
diagnostic code, so the config layer reports it like any other finding.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from te_assembly.errors import TeAssemblyError
from te_assembly.files.file_types import mode_kind
from te_assembly.files.names import inside

MiB = 2**20
LIMITS = {
    "config": 32 * MiB,
    "metadata": 16 * MiB,
    "index": 256 * MiB,
    "tokenizer": 512 * MiB,
    "prompt": 64 * MiB,
    "data": 16 * 2**30,
}
"""Largest file read, by kind: a config (a 10,000-step model is about 1 MB), a checkpoint's small JSON
(``config.json``, ``generation_config.json``, a cache entry's ``meta.json``), a shard index (the largest
on the Hub are about 10 MB), a ``tokenizer.json`` (about 35 MB for a 256k vocabulary), a prompt file, and
one text file of training data (read whole to tokenize it)."""
MAX_JSON_DEPTH = 100
"""Deepest nesting of JSON arrays and objects read (a ``config.json`` needs 4, a chat record 6)."""


class InputFileError(TeAssemblyError, ValueError):
    """A file a user pointed at cannot be read as one: missing, not a regular file, too large, outside
    the folder it was given in, not UTF-8, not JSON, or nested too deeply. ``code`` is a diagnostic code
    (``no-such-file``, ``not-a-file``, ``file-too-large``, ``outside-folder``, ``bad-encoding``,
    ``bad-json``, ``too-deep``, ``unreadable-file``); ``line`` the line where it is known."""

    def __init__(
        self, path: str | os.PathLike[str], problem: str, code: str, line: int | None = None
    ) -> None:
        self.path = str(path)
        self.problem = problem
        self.code = code
        self.line = line
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {problem}")


ErrorFactory = Callable[[str, str, str, "int | None"], Exception]
"""``make_error(path, problem, code, line)``: the exception a caller wants for a problem (default
``InputFileError``)."""


def _size_words(size: int) -> str:
    return f"{size / MiB:,.1f} MiB" if size >= MiB else f"{size:,} bytes"


def containment(within: str | os.PathLike[str]) -> Path:
    """The folder a file found in ``within`` must stay in: ``within`` itself, or for a snapshot of the
    Hugging Face cache (``.../models--ORG--NAME/snapshots/<revision>``, whose files are links to the
    repository's ``blobs/``, as huggingface_hub lays it out) that repository's folder."""
    folder = Path(within)
    repo = folder.parent.parent
    if folder.parent.name == "snapshots" and repo.name.startswith(("models--", "datasets--")):
        return repo
    return folder


def check_within(path: Path, within: str | os.PathLike[str] | None, make_error: ErrorFactory) -> None:
    """``make_error`` when ``path`` (symlinks resolved) leaves ``within`` (``containment``)."""
    if within is None or inside(path, containment(within)):
        return
    try:
        real = str(path.resolve())
    except (OSError, RuntimeError):
        real = "a symlink loop"
    raise make_error(
        str(path),
        f"it leads to {real}, outside {within} (the folder it was given in): refusing to read it",
        "outside-folder",
        None,
    )


@contextlib.contextmanager
def open_regular(
    path: str | os.PathLike[str],
    *,
    limit: int | None,
    within: str | os.PathLike[str] | None = None,
    make_error: ErrorFactory = InputFileError,
) -> Iterator[int]:
    """An open file descriptor of ``path`` if it is a regular file no larger than ``limit`` bytes inside
    ``within`` (module docstring); closed on exit."""
    p = Path(path)
    check_within(p, within, make_error)
    try:
        kind = mode_kind(os.stat(p).st_mode)
    except FileNotFoundError:
        raise make_error(str(p), "no such file", "no-such-file", None) from None
    except OSError as exc:
        raise make_error(str(p), f"cannot read it: {exc.strerror or exc}", "unreadable-file", None) from None
    if kind is not None:
        raise make_error(str(p), f"it is {kind}, not a regular file", "not-a-file", None)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(p, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise make_error(str(p), f"cannot read it: {exc.strerror or exc}", "unreadable-file", None) from None
    try:
        info = os.fstat(fd)
        kind = mode_kind(info.st_mode)
        if kind is not None:  # swapped after the check
            raise make_error(str(p), f"it is {kind}, not a regular file", "not-a-file", None)
        if limit is not None and info.st_size > limit:
            raise _too_large(p, info.st_size, limit, make_error)
        yield fd
    finally:
        os.close(fd)


def _too_large(path: Path, size: int | None, limit: int, make_error: ErrorFactory) -> Exception:
    has = f"it is {_size_words(size)}" if size is not None else "it holds more"
    return make_error(
        str(path), f"{has}; files of this kind are limited to {_size_words(limit)}", "file-too-large", None
    )


def _read(fd: int, size: int, path: str | os.PathLike[str], make_error: ErrorFactory) -> bytes:
    try:
        return os.read(fd, size)
    except OSError as exc:
        raise make_error(
            str(path), f"cannot read it: {exc.strerror or exc}", "unreadable-file", None
        ) from None


def read_bytes(
    path: str | os.PathLike[str],
    *,
    limit: int,
    within: str | os.PathLike[str] | None = None,
    make_error: ErrorFactory = InputFileError,
) -> bytes:
    """The content of ``path``, at most ``limit`` bytes (``open_regular``'s checks)."""
    with open_regular(path, limit=limit, within=within, make_error=make_error) as fd:
        chunks, total = [], 0
        while True:
            chunk = _read(fd, min(limit + 1 - total, 1 << 24), path, make_error)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise _too_large(Path(path), None, limit, make_error)
        return b"".join(chunks)


def sha256_file(
    path: str | os.PathLike[str],
    *,
    within: str | os.PathLike[str] | None = None,
    make_error: ErrorFactory = InputFileError,
    digest: Any = None,
) -> str:
    """The SHA-256 of ``path``'s content, read in chunks (``open_regular``'s checks, no size limit), or,
    given ``digest`` (a ``hashlib`` object), ``path``'s content fed into it and its hex digest."""
    h = digest if digest is not None else hashlib.sha256()
    with open_regular(path, limit=None, within=within, make_error=make_error) as fd:
        while True:
            chunk = _read(fd, 1 << 22, path, make_error)
            if not chunk:
                break
            h.update(chunk)
    return str(h.hexdigest())


def decode_utf8(
    raw: bytes, where: str, make_error: ErrorFactory = InputFileError, *, bom: bool = True
) -> str:
    """``raw`` as text; a byte that is not UTF-8 is named with its offset and line. ``bom``: a leading
    byte-order mark is dropped (editors on Windows write one)."""
    try:
        return raw.decode("utf-8-sig" if bom else "utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise make_error(
            where,
            f"not UTF-8 text: byte {exc.start} is 0x{raw[exc.start]:02x} (save or convert it as UTF-8)",
            "bad-encoding",
            line,
        ) from None


def read_text(
    path: str | os.PathLike[str],
    *,
    limit: int,
    within: str | os.PathLike[str] | None = None,
    make_error: ErrorFactory = InputFileError,
    bom: bool = True,
) -> str:
    """``path`` as UTF-8 text (``read_bytes``, then ``decode_utf8``)."""
    return decode_utf8(
        read_bytes(path, limit=limit, within=within, make_error=make_error), str(path), make_error, bom=bom
    )


class _Duplicate(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def too_deep(value: Any, max_depth: int) -> bool:
    """Whether ``value`` (parsed JSON or YAML: dicts and lists) nests deeper than ``max_depth``; walked
    without recursion."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > max_depth:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def parse_json(
    text: str, where: str, *, max_depth: int = MAX_JSON_DEPTH, make_error: ErrorFactory = InputFileError
) -> Any:
    """``text`` as JSON: a syntax error names its line, a key given twice is refused (the second would
    silently win), and nesting deeper than ``max_depth`` is refused (Python's parser stops at about
    1000 levels with a RecursionError; the code that walks the result would too)."""
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise make_error(
            where, f"not valid JSON: {exc.msg} (column {exc.colno})", "bad-json", exc.lineno
        ) from None
    except _Duplicate as dup:
        line = _second_line(text, dup.key)
        raise make_error(
            where, f"key {dup.key!r} appears twice (the second would silently win)", "bad-json", line
        ) from None
    except RecursionError:
        raise make_error(where, f"nested deeper than {max_depth} levels", "too-deep", None) from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise make_error(where, f"not valid JSON: {exc}", "bad-json", None) from None
    if too_deep(value, max_depth):
        raise make_error(where, f"nested deeper than {max_depth} levels", "too-deep", None)
    return value


def _second_line(text: str, key: str) -> int | None:
    hits = [m.start() for m in re.finditer(rf'"{re.escape(json.dumps(key)[1:-1])}"\s*:', text)]
    return text.count("\n", 0, hits[1]) + 1 if len(hits) > 1 else None


def read_json(
    path: str | os.PathLike[str],
    *,
    limit: int,
    within: str | os.PathLike[str] | None = None,
    max_depth: int = MAX_JSON_DEPTH,
    make_error: ErrorFactory = InputFileError,
) -> Any:
    """``path`` as JSON (``read_text`` and ``parse_json``)."""
    text = read_text(path, limit=limit, within=within, make_error=make_error)
    return parse_json(text, str(path), max_depth=max_depth, make_error=make_error)


__all__ = [
    "LIMITS",
    "MAX_JSON_DEPTH",
    "InputFileError",
    "check_within",
    "decode_utf8",
    "open_regular",
    "parse_json",
    "read_bytes",
    "read_json",
    "read_text",
    "sha256_file",
    "too_deep",
]
