"""The three tokenizers a language model may use, behind one small interface.

- byte-level (the default): each UTF-8 byte is its own id (0-255) and ``<|endoftext|>`` is 256; needs no
  file and round-trips any text exactly;
- a Hugging Face ``tokenizer.json`` read with the ``tokenizers`` library;
- a byte-level BPE trained with ``tokenizers`` on the training documents (``data.tokenizer.train_vocab``).

``fingerprint`` names a tokenizer's exact behaviour (the tokenized cache and the run record key on it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

from te_assembly.errors import DataError
from te_assembly.files.read import LIMITS, read_text
from te_assembly.files.write import write_text_atomic

BYTE_VOCAB = 257
"""256 bytes and ``<|endoftext|>``."""


class Tokenizer(Protocol):
    vocab_size: int
    eot_id: int
    fingerprint: str
    kind: str

    def encode(self, text: str, special: bool = False) -> list[int]:
        """The ids of ``text``; ``special``: with the special tokens the tokenizer's post-processor adds
        (a Llama tokenizer's BOS), as ``transformers``' ``encode`` does by default."""
        ...

    def token_id(self, token: str) -> int | None:
        """The id of the token spelt ``token`` (a special token's text), None when there is none."""
        ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """The ids of ``text`` and, for each, the characters ``[start, end)`` of ``text`` it covers."""
        ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def save(self, path: Path) -> Path | None:
        """Write ``tokenizer.json`` (nothing for byte-level, which needs no file)."""
        ...


class ByteTokenizer:
    kind = "byte"
    vocab_size = BYTE_VOCAB
    eot_id = 256
    fingerprint = "byte-level/1"

    def encode(self, text: str, special: bool = False) -> list[int]:
        return list(text.encode("utf-8"))  # no special tokens to add

    def token_id(self, token: str) -> int | None:
        return self.eot_id if token == "<|endoftext|>" else None

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        for index, char in enumerate(text):
            encoded = char.encode("utf-8")
            ids += encoded
            offsets += [(index, index + 1)] * len(encoded)
        return ids, offsets

    def decode(self, ids: Sequence[int]) -> str:
        # A generated id may end mid-character: show what is there (U+FFFD for a cut sequence).
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def save(self, path: Path) -> Path | None:
        return None


class HFTokenizer:
    """A ``tokenizers.Tokenizer``: read from a ``tokenizer.json`` or trained here."""

    def __init__(self, tokenizer: object, eot: str, kind: str, source: str) -> None:
        self._tok = tokenizer
        self.kind = kind
        self.source = source
        eot_id = tokenizer.token_to_id(eot)  # type: ignore[attr-defined]
        if eot_id is None:
            raise DataError(
                f"{source} has no {eot!r} token to join documents with: name its end-of-text token with "
                "data.tokenizer.eot (GPT-2's is <|endoftext|>, Llama 3's <|end_of_text|>)"
            )
        self.eot_id = int(eot_id)
        self.eot = eot
        # An added token may have an id past the vocabulary's size: ids are stored by the largest one.
        ids = tokenizer.get_vocab(with_added_tokens=True).values()  # type: ignore[attr-defined]
        size = int(tokenizer.get_vocab_size(with_added_tokens=True))  # type: ignore[attr-defined]
        self.vocab_size = max(size, max(ids, default=-1) + 1)
        self._json = tokenizer.to_str()  # type: ignore[attr-defined]
        self.fingerprint = "tokenizers/" + hashlib.sha256(self._json.encode()).hexdigest()

    def _failed(self, exc: Exception) -> DataError:
        return DataError(f"{self.source} cannot tokenize this text: {exc}")

    def encode(self, text: str, special: bool = False) -> list[int]:
        try:
            return list(self._tok.encode(text, add_special_tokens=special).ids)  # type: ignore[attr-defined]
        except Exception as exc:  # tokenizers raises plain Exceptions (a WordLevel without its unk token)
            raise self._failed(exc) from None

    def token_id(self, token: str) -> int | None:
        found = self._tok.token_to_id(token)  # type: ignore[attr-defined]
        return None if found is None else int(found)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        try:
            encoded = self._tok.encode_batch(list(texts), add_special_tokens=False)  # type: ignore[attr-defined]
        except Exception as exc:
            raise self._failed(exc) from None
        return [list(e.ids) for e in encoded]

    def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        try:
            encoding = self._tok.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]
        except Exception as exc:
            raise self._failed(exc) from None
        return list(encoding.ids), [(int(a), int(b)) for a, b in encoding.offsets]

    def decode(self, ids: Sequence[int]) -> str:
        try:
            return str(self._tok.decode(list(ids), skip_special_tokens=True))  # type: ignore[attr-defined]
        except Exception as exc:
            raise DataError(f"{self.source} cannot decode ids: {exc}") from None

    def save(self, path: Path) -> Path | None:
        return write_text_atomic(path, self._json)


def _tokenizers():  # type: ignore[no-untyped-def]
    try:
        import tokenizers
    except ImportError as exc:  # a dependency of te_assembly; an environment without it is broken
        from te_assembly.errors import MissingToolError

        raise MissingToolError(
            "a tokenizer.json or a trained BPE needs the tokenizers library: pip install tokenizers"
        ) from exc
    return tokenizers


def _data_error(path: str, problem: str, code: str, line: int | None) -> DataError:
    return DataError(f"{path}{f':{line}' if line else ''}: {problem}")


def read_tokenizer_text(path: Path, within: Path | None = None) -> str:
    """A ``tokenizer.json``'s text through the shared bounded reader (``DataError`` naming the file)."""
    return read_text(path, limit=LIMITS["tokenizer"], within=within, make_error=_data_error)


def _parsed(text: str, source: str) -> object:
    try:
        return _tokenizers().Tokenizer.from_str(text)
    except Exception as exc:  # tokenizers raises plain Exceptions for a malformed file
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise DataError(f"{source} is not a tokenizer.json the tokenizers library reads: {first}") from None


def load_tokenizer_file(path: Path, eot: str, within: Path | None = None) -> HFTokenizer:
    """A ``tokenizer.json`` (``DataError`` when it is missing, unreadable or not one)."""
    if not path.exists() and not path.is_symlink():
        raise DataError(f"{path}: no such file (a Hugging Face tokenizer.json)")
    return HFTokenizer(_parsed(read_tokenizer_text(path, within), str(path)), eot, "file", str(path))


def text_fingerprint(text: str, source: str) -> str:
    """The ``fingerprint`` of the tokenizer ``text`` holds (a ``tokenizer.json``'s content), whatever its
    end-of-text token: what a model records of the tokenizer it was trained with."""
    return "tokenizers/" + hashlib.sha256(_parsed(text, source).to_str().encode()).hexdigest()  # type: ignore[attr-defined]


def train_bpe(texts: Iterable[str], vocab: int, eot: str) -> HFTokenizer:
    """A byte-level BPE of ``vocab`` ids (the 256 bytes, ``eot`` and merges) trained on ``texts``."""
    tokenizers = _tokenizers()
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[eot],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return HFTokenizer(tok, eot, "bpe", f"a BPE of {vocab} ids trained on the corpus")


def from_json(text: str, eot: str, kind: str, source: str) -> HFTokenizer:
    """A tokenizer from its ``tokenizer.json`` text (a trained BPE kept in the cache, or beside a run)."""
    return HFTokenizer(_parsed(text, source), eot, kind, source)


__all__ = [
    "BYTE_VOCAB",
    "ByteTokenizer",
    "HFTokenizer",
    "Tokenizer",
    "from_json",
    "load_tokenizer_file",
    "read_tokenizer_text",
    "text_fingerprint",
    "train_bpe",
]
