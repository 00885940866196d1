"""What a ``data.path`` names, as documents: text files, JSON Lines records, or pre-tokenized files.

Every problem is a ``DataError`` that names the file (and line): a path that does not exist, a folder or
glob with no text in it, a binary or non-UTF-8 file, a JSON Lines record without its text field.

Files are found without following symlinked folders (a symlink loop cannot make a glob endless or read
one file many times), each file is read once however many paths lead to it, and a symlink that leads out
of the folder given (or the pattern's folder) is refused: every read goes through the shared bounded
reader (``files.read``: regular files only, at most ``LIMITS["data"]`` bytes each).
"""

from __future__ import annotations

import hashlib
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from te_assembly.data.settings import DataSettings
from te_assembly.errors import DataError
from te_assembly.files.file_types import not_regular
from te_assembly.files.read import LIMITS, check_within, parse_json, read_bytes, sha256_file

DEFAULT_CORPUS = "the Python standard library's source"
_DATASET_MARKERS = ("dataset_info.json", "dataset_dict.json")
"""What ``datasets``' ``save_to_disk`` writes into a dataset's folder (a Dataset; a DatasetDict)."""
_SKIPPED_DIRS = {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"}


@dataclass(frozen=True)
class Document:
    name: str
    """Its file (and ``:line`` for a JSON Lines record): what errors and the split read."""
    text: str


@dataclass(frozen=True)
class Sources:
    kind: str
    """``text`` (text files and JSON Lines: documents to tokenize), ``datasets`` (a Hugging Face dataset
    saved with ``save_to_disk``: documents too) or ``tokens`` (pre-tokenized files)."""
    files: tuple[Path, ...]
    description: str
    """For messages and the run: ``data.path=notes/ (12 files)``."""
    root: Path | None = None
    """A ``datasets`` dataset's folder."""

    def fingerprint(self) -> str:
        """SHA-256 of every file's name and content, in order: a changed file changes it."""
        digest = hashlib.sha256()
        for path in self.files:
            digest.update(str(path).encode() + b"\0")
            sha256_file(path, make_error=_data_error, digest=digest)
            digest.update(b"\0")
        return digest.hexdigest()


def stdlib_files() -> list[Path]:
    """The default corpus: the standard library's ``.py`` files, without its tests and site-packages."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(
        p
        for p in root.rglob("*.py")
        if not any(
            part in _SKIPPED_DIRS or part.startswith("test") for part in p.relative_to(root).parts[:-1]
        )
        and not p.name.startswith("test_")
    )


def find_sources(settings: DataSettings) -> Sources:
    if settings.path is None:
        files = stdlib_files()
        if not files:
            raise DataError(
                "the default corpus (the Python standard library's source) is not on this machine"
            )
        return Sources("text", tuple(files), f"{DEFAULT_CORPUS} ({len(files)} files)")
    given = settings.path
    path = Path(given).expanduser()
    if any(c in given for c in "*?["):
        root, pattern = _pattern_root(path)
        # As the shell's glob: a wildcard does not match a hidden name (unless the pattern spells the dot).
        dotted = any(part.startswith(".") for part in Path(pattern).parts)
        matched = (p for p in root.glob(pattern) if dotted or not _hidden(p, root))
        files = _found(root, matched)
        if not files:
            raise DataError(f"data.path={given}: the pattern matches no file")
        where = f"data.path={given} ({len(files)} files)"
    elif path.is_dir() and any((path / marker).is_file() for marker in _DATASET_MARKERS):
        files = _found(path, path.rglob("*"))
        return Sources("datasets", tuple(files), f"data.path={given} (a datasets dataset)", path)
    elif path.is_dir():
        suffixes = {s.lower() for s in settings.suffixes}
        candidates = (
            p
            for p in path.rglob("*")
            if p.suffix.lower() in suffixes | {".jsonl", ".bin"} and not _hidden(p, path)
        )
        files = _found(path, candidates)
        if not files:
            raise DataError(
                f"data.path={given}: the folder holds no file ending in {', '.join(sorted(suffixes))}, "
                ".jsonl or .bin (data.suffixes chooses the text files)"
            )
        where = f"data.path={given} ({len(files)} files)"
    elif path.exists() or path.is_symlink():
        _check_regular(path)
        files, where = [path], f"data.path={given}"
    else:
        raise DataError(f"data.path={given}: no such file or folder")
    kinds = {_kind(p, settings.format) for p in files}
    if len(kinds) > 1:
        raise DataError(
            f"{where} mixes pre-tokenized .bin files with text: give one kind (data.format chooses)"
        )
    return Sources(kinds.pop(), tuple(files), where)


def _pattern_root(path: Path) -> tuple[Path, str]:
    """The folder a glob starts in (its parts before the first wildcard) and the rest of the pattern."""
    parts = path.parts
    first = next(i for i, part in enumerate(parts) if any(c in part for c in "*?["))
    root = Path(*parts[:first]) if first else Path(".")
    return root, str(Path(*parts[first:]))


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def _found(root: Path, candidates: Iterable[Path]) -> list[Path]:
    """The regular files among ``candidates`` (found under ``root`` without following symlinked
    folders), sorted, each once however many paths lead to it; ``DataError`` for a symlink that leads
    out of ``root``."""
    chosen: dict[Path, Path] = {}
    for candidate in candidates:
        if candidate.is_dir():  # walked into, or a symlinked folder: not followed
            continue
        check_within(candidate, root, _data_error)
        _check_regular(candidate)
        chosen.setdefault(candidate.resolve(), candidate)
    return sorted(chosen.values())


def _check_regular(path: Path) -> None:
    """``DataError`` for a path that is no regular file (a FIFO, a device, a socket, a broken link)."""
    kind = not_regular(path) if path.exists() else "a broken symlink"
    if kind is not None:
        raise DataError(f"{path} is {kind}, not a data file: refusing to read it (leave it out of data.path)")


def _data_error(path: str, problem: str, code: str, line: int | None) -> DataError:
    where = f"{path}:{line}" if line is not None else path
    return DataError(f"{where}: {problem} (data.path)")


def _kind(path: Path, fmt: str) -> str:
    if fmt == "tokens" or (fmt == "auto" and path.suffix.lower() == ".bin"):
        return "tokens"
    return "text"


def documents(sources: Sources, settings: DataSettings) -> Iterator[Document]:
    """Every non-empty document, in file order (a JSON Lines file gives one per record, a ``datasets``
    dataset one per row of each split)."""
    if sources.kind == "datasets":
        assert sources.root is not None
        yield from _dataset_rows(sources.root, settings.text_field)
        return
    for path in sources.files:
        jsonl = settings.format == "jsonl" or (settings.format == "auto" and path.suffix.lower() == ".jsonl")
        if jsonl:
            yield from _records(path, settings.text_field)
            continue
        text = read_text(path)
        if text:
            yield Document(str(path), text)


def read_text(path: Path) -> str:
    """A text file of the corpus through the shared bounded reader, as UTF-8 (a binary file named)."""
    raw = read_bytes(path, limit=LIMITS["data"], make_error=_data_error)
    if b"\0" in raw[:65536]:
        raise DataError(
            f"{path} is a binary file, not text (a NUL byte at its start): leave it out of data.path"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DataError(
            f"{path} is not UTF-8 text: byte {exc.start} (line {line}) is 0x{raw[exc.start]:02x}; convert it "
            "(iconv -t utf-8) or leave it out of data.path"
        ) from None


def _record_error(where: str, problem: str, code: str, line: int | None) -> DataError:
    return DataError(f"{where} is not a JSON record: {problem}")


def _dataset_rows(root: Path, field: str) -> Iterator[Document]:
    try:
        import datasets
    except ImportError:
        from te_assembly.errors import MissingToolError

        raise MissingToolError(
            f"data.path={root} is a Hugging Face datasets dataset: reading it needs the datasets library "
            "(pip install 'te_assembly[datasets]')"
        ) from None
    try:
        loaded = datasets.load_from_disk(str(root))
    except Exception as exc:  # datasets raises many kinds for a damaged folder
        raise DataError(f"data.path={root}: datasets cannot load it: {exc}") from None
    splits = loaded.items() if isinstance(loaded, datasets.DatasetDict) else [("", loaded)]
    for split, table in splits:
        if field not in table.column_names:
            raise DataError(
                f"data.path={root}{f' (split {split})' if split else ''} has no column {field!r} (it has: "
                f"{', '.join(table.column_names)}); data.text_field names the text's column"
            )
        for number, value in enumerate(table[field]):
            where = f"{root}:{split + ':' if split else ''}{number}"
            if not isinstance(value, str):
                raise DataError(f"{where}: {field!r} is a {type(value).__name__}, not text")
            if value:
                yield Document(where, value)


def json_records(path: Path) -> Iterator[tuple[str, Any]]:
    """``(where, record)`` of each non-blank line of the JSON Lines file ``path`` (``where``: its file
    and line), each line through the shared JSON parser (``DataError`` naming a line that is no JSON)."""
    for number, line in enumerate(read_text(path).splitlines(), 1):
        if line.strip():
            where = f"{path}:{number}"
            yield where, parse_json(line, where, make_error=_record_error)


def _records(path: Path, field: str) -> Iterator[Document]:
    for where, record in json_records(path):
        if not isinstance(record, dict) or field not in record:
            keys = ", ".join(sorted(record)) if isinstance(record, dict) else type(record).__name__
            raise DataError(
                f"{where} has no {field!r} field (it has: {keys}); data.text_field names the text's field"
            )
        value = record[field]
        if not isinstance(value, str):
            raise DataError(f"{where}: {field!r} is a {type(value).__name__}, not text")
        if value:
            yield Document(where, value)


__all__ = [
    "DEFAULT_CORPUS",
    "Document",
    "Sources",
    "documents",
    "find_sources",
    "json_records",
    "read_text",
    "stdlib_files",
]
