"""Tokenize once: a corpus's token ids in memory-mapped files, keyed by what went in.

The key is a hash of the sources' names and contents, the tokenizer's fingerprint and the split
settings, so a changed file, tokenizer or ``val_fraction`` makes a new entry and an unchanged corpus is
read back at once. An entry is written in a scratch folder and renamed into place whole: a run killed
while tokenizing leaves no half-written entry, only a scratch folder the next run removes.

Every file of an entry has its size and SHA-256 in ``meta.json``, and ``meta.json`` the SHA-256 of its
own content (``meta_sha256``), all checked in full every time the entry is opened (a fresh run, a
resume, ``eval``): a file's times say nothing of an edit made within the same clock tick, so none is
trusted. Hashing costs about a second per GiB of ids (``bench/token_cache.py``). An entry that does not
match is tokenized again, never trained on. Runs that want the same entry at once take turns on a lock
file (``<key>.lock``): one builds it, the others then read it.

Layout of an entry ``<cache>/<key>/``: ``train.bin`` and ``val.bin`` (the ids of each split's documents,
each followed by the end-of-text id, as ``uint16`` or ``uint32``: the narrowest that holds the vocabulary),
``meta.json`` (counts, hashes) and, for a BPE trained here, ``tokenizer.json``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from te_assembly.data.settings import DataSettings
from te_assembly.data.sources import Document, Sources, documents, find_sources
from te_assembly.data.tokenizer import (
    ByteTokenizer,
    Tokenizer,
    from_json,
    load_tokenizer_file,
    train_bpe,
)
from te_assembly.errors import DataError
from te_assembly.files.read import LIMITS, read_json, read_text, sha256_file
from te_assembly.files.write import write_text_atomic

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: concurrent runs tokenize the same corpus twice
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

VERSION = 3
Progress = Callable[[int, int], None]
"""``(done, total)`` bytes of text tokenized."""


@dataclass
class Tokenized:
    train: np.ndarray
    val: np.ndarray
    tokenizer: Tokenizer
    meta: dict[str, Any]
    """``sources``, ``sources_sha256``, ``tokenizer``, ``documents`` / ``bytes`` / ``tokens`` per split."""
    directory: Path | None
    """The cache entry (None: pre-tokenized files read where they are)."""


def cache_root(settings: DataSettings) -> Path:
    if settings.cache_dir is not None:
        return Path(settings.cache_dir).expanduser()
    env = os.environ.get("TE_ASSEMBLY_CACHE")
    base = Path(env).expanduser() if env else Path.home() / ".cache" / "te_assembly"
    return base / "tokens"


def is_validation(name: str, fraction: float) -> bool:
    """Whether the document named ``name`` is held out: a hash of its name, so the split never depends
    on the order files are found in, and adding a document leaves every other where it was."""
    value = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") / 2**64
    return value < fraction


def split(docs: Sequence[Document], fraction: float) -> tuple[list[Document], list[Document]]:
    """Train and validation documents. With ``fraction > 0`` both get at least one when there are two or
    more documents; one document goes to training whatever its name, and is split by position later
    (``prepare``)."""
    if len(docs) == 1:
        return list(docs), []
    train = [d for d in docs if not is_validation(d.name, fraction)]
    val = [d for d in docs if is_validation(d.name, fraction)]
    if fraction > 0 and len(docs) >= 2:
        if not val:
            val = [min(train, key=lambda d: hashlib.sha256(d.name.encode()).digest())]
            train = [d for d in train if d is not val[0]]
        if not train:
            train = [val.pop()]
    return train, val


def prepare(settings: DataSettings, progress: Progress | None = None) -> Tokenized:
    """The corpus ``settings`` name, tokenized (from the cache when it is there). ``DataError`` for every
    problem with the data, before anything is written."""
    sources = find_sources(settings)
    if sources.kind == "tokens":
        return _pretokenized(sources, settings)
    fingerprint = sources.fingerprint()
    tok_settings = settings.tokenizer
    tokenizer: Tokenizer | None = None
    if tok_settings.kind == "byte":
        tokenizer = ByteTokenizer()
    elif tok_settings.kind == "file":
        assert tok_settings.path is not None
        tokenizer = load_tokenizer_file(Path(tok_settings.path).expanduser(), tok_settings.eot)
    tok_key = (
        tokenizer.fingerprint
        if tokenizer is not None
        else f"bpe/{tok_settings.train_vocab}/{tok_settings.eot}"
    )
    key = _key(fingerprint, tok_key, settings)
    root = cache_root(settings)
    entry = root / key
    found = _read_entry(entry, tokenizer, settings) if entry.is_dir() and not entry.is_symlink() else None
    if found is not None:
        return found
    # Every document read (any problem with the data found) before anything is written.
    docs = list(documents(sources, settings))
    if not docs:
        raise DataError(f"{sources.description} holds no text: every file (or record) is empty")
    with _entry_lock(root, key):
        if entry.exists() or entry.is_symlink():
            found = _read_entry(entry, tokenizer, settings) if not entry.is_symlink() else None
            if found is not None:  # another run built it while this one waited
                return found
            log.warning("the tokenized corpus in %s does not match its checksums: tokenizing again", entry)
            if entry.is_symlink():
                entry.unlink()
            else:
                shutil.rmtree(entry, ignore_errors=True)
        tokenizer = _tokenize(docs, sources, settings, tokenizer, fingerprint, key, root, progress)
        found = _read_entry(entry, tokenizer, settings)
        if found is None:
            raise DataError(
                f"the tokenized corpus just written to {entry} cannot be read back (data.cache_dir)"
            )
        return found


def _tokenize(
    docs: Sequence[Document],
    sources: Sources,
    settings: DataSettings,
    tokenizer: Tokenizer | None,
    fingerprint: str,
    key: str,
    root: Path,
    progress: Progress | None,
) -> Tokenizer:
    """Tokenize the corpus into the cache entry ``root/key`` (under its lock); the tokenizer used."""
    tok_settings = settings.tokenizer
    train_docs, val_docs = split(docs, settings.val_fraction)
    if tokenizer is None:
        assert tok_settings.train_vocab is not None
        tokenizer = train_bpe((d.text for d in train_docs), tok_settings.train_vocab, tok_settings.eot)
    dtype = id_dtype(tokenizer.vocab_size)
    total = sum(len(d.text) for d in docs)
    counter = _Counter(total, progress)
    train_ids = _encode(train_docs, tokenizer, dtype, counter)
    val_ids = _encode(val_docs, tokenizer, dtype, counter)
    if len(docs) == 1 and settings.val_fraction > 0:  # one document: held out by position
        cut = len(train_ids) - max(1, int(len(train_ids) * settings.val_fraction))
        train_ids, val_ids = train_ids[:cut].copy(), train_ids[cut:].copy()
    meta = {
        "version": VERSION,
        "key": key,
        "sources": sources.description,
        "sources_sha256": fingerprint,
        "tokenizer": tokenizer.fingerprint,
        "tokenizer_kind": tokenizer.kind,
        "vocab_size": tokenizer.vocab_size,
        "eot_id": tokenizer.eot_id,
        "dtype": np.dtype(dtype).name,
        "documents": {"train": len(train_docs), "val": len(val_docs)},
        "bytes": {"train": _bytes(train_docs), "val": _bytes(val_docs)},
        "tokens": {"train": len(train_ids), "val": len(val_ids)},
    }
    if len(docs) == 1:
        meta["bytes"] = _position_split_bytes(docs[0], train_ids, val_ids)
    _write_entry(root, key, train_ids, val_ids, meta, tokenizer)
    return tokenizer


@contextlib.contextmanager
def _entry_lock(root: Path, key: str) -> Iterator[None]:
    """Hold ``<root>/<key>.lock`` (exclusively): one run builds or checks an entry at a time."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise DataError(
            f"cannot use the token cache {root}: {exc.strerror or exc} (data.cache_dir)"
        ) from None
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


class _Counter:
    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total, self.done, self.progress = total, 0, progress

    def add(self, n: int) -> None:
        self.done += n
        if self.progress is not None:
            self.progress(self.done, self.total)


def _encode(docs: Sequence[Document], tokenizer: Tokenizer, dtype: Any, counter: _Counter) -> np.ndarray:
    parts: list[np.ndarray] = []
    eot = np.array([tokenizer.eot_id], dtype=dtype)
    if isinstance(tokenizer, ByteTokenizer):
        for doc in docs:
            parts.extend((np.frombuffer(doc.text.encode("utf-8"), dtype=np.uint8).astype(dtype), eot))
            counter.add(len(doc.text))
    else:
        for start in range(0, len(docs), 256):
            chunk = docs[start : start + 256]
            for ids in tokenizer.encode_batch([d.text for d in chunk]):
                parts.extend((np.asarray(ids, dtype=dtype), eot))
            counter.add(sum(len(d.text) for d in chunk))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def _bytes(docs: Sequence[Document]) -> int:
    return sum(len(d.text.encode("utf-8")) for d in docs)


def _position_split_bytes(doc: Document, train: np.ndarray, val: np.ndarray) -> dict[str, int]:
    """Bytes per split of a document split by position, in proportion to its tokens."""
    size = len(doc.text.encode("utf-8"))
    tokens = len(train) + len(val)
    val_bytes = round(size * len(val) / tokens) if tokens else 0
    return {"train": size - val_bytes, "val": val_bytes}


def _key(sources_sha256: str, tokenizer: str, settings: DataSettings) -> str:
    what = {
        "version": VERSION,
        "sources": sources_sha256,
        "tokenizer": tokenizer,
        "val_fraction": settings.val_fraction,
        "format": settings.format,
        "text_field": settings.text_field,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


def _write_entry(
    root: Path, key: str, train: np.ndarray, val: np.ndarray, meta: dict[str, Any], tokenizer: Tokenizer
) -> None:
    """Write the entry in a scratch folder, every file's size and SHA-256 in its ``meta.json``, and
    rename it into place (under the entry's lock: no other run writes it meanwhile)."""
    try:
        for stale in root.glob(f".{key}.*"):  # a run killed while writing this entry
            shutil.rmtree(stale, ignore_errors=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
        train.tofile(scratch / "train.bin")
        val.tofile(scratch / "val.bin")
        if tokenizer.kind == "bpe":
            tokenizer.save(scratch / "tokenizer.json")
        meta = {**meta, "files": {p.name: _file_record(p) for p in sorted(scratch.iterdir())}}
        write_text_atomic(
            scratch / "meta.json", json.dumps({**meta, "meta_sha256": _meta_digest(meta)}, indent=1)
        )
        os.rename(scratch, root / key)
    except OSError as exc:
        raise DataError(
            f"cannot write the tokenized corpus into {root}: {exc.strerror or exc} (data.cache_dir)"
        ) from None


def _file_record(path: Path) -> dict[str, Any]:
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


def _meta_digest(meta: dict[str, Any]) -> str:
    """The SHA-256 of ``meta`` (without its own digest), as canonical JSON."""
    rest = {k: v for k, v in meta.items() if k != "meta_sha256"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()


def id_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned type that holds every id of a vocabulary."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


def _verified(entry: Path, meta: dict[str, Any]) -> bool:
    """``meta`` is the one written with the entry (its own digest, its key, the dtype its vocabulary
    needs) and every file it lists is there with its size and SHA-256, each hashed in full."""
    files = meta.get("files")
    if meta.get("meta_sha256") != _meta_digest(meta) or meta.get("key") != entry.name:
        return False
    vocab = meta.get("vocab_size")
    if not isinstance(vocab, int) or meta.get("dtype") != id_dtype(vocab).name:
        return False
    if not isinstance(files, dict) or not {"train.bin", "val.bin"} <= set(files):
        return False
    for name, record in files.items():
        path = entry / name
        if not isinstance(record, dict) or not path.is_file() or path.is_symlink():
            return False
        if path.stat().st_size != record.get("bytes"):
            return False
        if sha256_file(path, within=entry) != record.get("sha256"):
            return False
    return True


def _read_entry(entry: Path, tokenizer: Tokenizer | None, settings: DataSettings) -> Tokenized | None:
    """The entry, checked (``_verified``); None when it is damaged or does not match its checksums."""
    try:
        meta = read_json(entry / "meta.json", limit=LIMITS["metadata"], within=entry)
        if not isinstance(meta, dict) or not _verified(entry, meta):
            return None
        dtype = np.dtype(meta["dtype"])
        arrays = [_memmap(entry / f"{name}.bin", dtype) for name in ("train", "val")]
        if [len(a) for a in arrays] != [meta["tokens"]["train"], meta["tokens"]["val"]]:
            return None  # damaged: make it again
        if tokenizer is None:
            tok_json = read_text(entry / "tokenizer.json", limit=LIMITS["tokenizer"], within=entry)
            tokenizer = from_json(
                tok_json, settings.tokenizer.eot, "bpe", f"the BPE trained on {meta['sources']}"
            )
    except (OSError, ValueError, KeyError, TypeError, DataError):
        return None
    return Tokenized(arrays[0], arrays[1], tokenizer, meta, entry)


def _memmap(path: Path, dtype: np.dtype) -> np.ndarray:
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def _pretokenized(sources: Sources, settings: DataSettings) -> Tokenized:
    """``.bin`` files of token ids: nanoGPT's ``train.bin`` + ``val.bin`` pair, or one file whose last
    ``val_fraction`` is held out. Read where they are, memory-mapped; ids are checked against the model
    when the corpus meets it (``Corpus.check_fits``)."""
    dtype = np.dtype(settings.token_dtype)
    by_name = {p.name: p for p in sources.files}
    for path in sources.files:
        if path.stat().st_size % dtype.itemsize:
            raise DataError(
                f"{path} is {path.stat().st_size} bytes, not whole {dtype.name} ids: is data.token_dtype "
                "right?"
            )
    if set(by_name) >= {"train.bin", "val.bin"} and len(sources.files) == 2:
        train, val = _memmap(by_name["train.bin"], dtype), _memmap(by_name["val.bin"], dtype)
    elif len(sources.files) == 1:
        ids = _memmap(sources.files[0], dtype)
        cut = len(ids) - int(len(ids) * settings.val_fraction)
        train, val = ids[:cut], ids[cut:]
    else:
        names = ", ".join(p.name for p in sources.files[:5])
        raise DataError(
            f"{sources.description}: several token files ({names}): name them train.bin and val.bin "
            "(nanoGPT's layout) or give one file"
        )
    if len(train) == 0:
        raise DataError(f"{sources.description} holds no token ids")
    meta = {
        "sources": sources.description,
        "sources_sha256": sources.fingerprint(),
        "tokenizer": "pre-tokenized",
        "tokenizer_kind": "tokens",
        "dtype": dtype.name,
        "tokens": {"train": len(train), "val": len(val)},
    }

    class _Ids(ByteTokenizer):
        """Ids as they are: decoding shows them as numbers (the files carry no tokenizer)."""

        kind = "tokens"
        fingerprint = "pre-tokenized"

        def __init__(self, vocab: int) -> None:
            self.vocab_size = vocab
            self.eot_id = -1

        def decode(self, ids: Sequence[int]) -> str:
            return " ".join(str(i) for i in ids)

    top = int(max(train.max(initial=0), val.max(initial=0)))
    return Tokenized(train, val, _Ids(top + 1), meta, None)


__all__ = ["Tokenized", "cache_root", "is_validation", "prepare", "split"]
