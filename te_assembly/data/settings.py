"""The ``data:`` section: where a language model's text comes from and how it is tokenized."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from te_assembly.diagnostics import error
from te_assembly.errors import ConfigError
from te_assembly.fields import FieldSpec
from te_assembly.sections import read_section, setting, subsection

FORMATS = ("auto", "text", "jsonl", "tokens", "chat", "preference")
TOKEN_DTYPES = ("uint16", "uint32")
TEXT_SUFFIXES = [
    ".txt",
    ".md",
    ".rst",
    ".py",
    ".c",
    ".h",
    ".cpp",
    ".rs",
    ".go",
    ".js",
    ".ts",
    ".tex",
    ".html",
]


@dataclass(frozen=True)
class TokenizerSettings:
    """``data.tokenizer``: byte-level unless a file or a vocabulary to train is named."""

    path: str | None = setting(
        None, nonempty=True, doc="a Hugging Face tokenizer.json (null: byte-level, 256 bytes + <|endoftext|>)"
    )
    train_vocab: int | None = setting(
        None,
        minimum=258,
        maximum=2**32 - 1,
        doc="train a byte-level BPE of this many ids on the training documents (saved beside the run)",
    )
    eot: str = setting("<|endoftext|>", nonempty=True, doc="the end-of-text token joining documents")

    def __post_init__(self) -> None:
        if self.path is not None and self.train_vocab is not None:
            raise ConfigError(
                [
                    error(
                        "data.tokenizer.train_vocab",
                        "conflicting-settings",
                        f"data.tokenizer.path={self.path} names a tokenizer and data.tokenizer.train_vocab="
                        f"{self.train_vocab} asks to train one: give only one",
                    )
                ]
            )

    @property
    def kind(self) -> str:
        return "file" if self.path is not None else "bpe" if self.train_vocab is not None else "byte"


@dataclass(frozen=True)
class DataSettings:
    """``data:``: a language model's text (``train`` and ``generate`` on a model with token-id input)."""

    path: str | None = setting(
        None,
        nonempty=True,
        doc="a text file, a folder, a glob, a .jsonl, a pre-tokenized .bin, or a datasets save_to_disk "
        "folder (null: the default corpus, the Python standard library's own source)",
    )
    format: str = setting(
        "auto",
        choices=FORMATS,
        doc="auto: by suffix (.jsonl: JSON Lines, .bin: tokens, else text); chat: JSON Lines of "
        "conversations ({messages: [{role, content}]}) rendered with the chat template beside "
        "data.tokenizer.path, the loss on the assistant's tokens only; preference: JSON Lines of {prompt, "
        "chosen, rejected} (strings or message lists) for train.objective=dpo",
    )
    packing: bool = setting(
        False,
        doc="train: several documents (text) or conversations (chat) side by side in each row, attention "
        "kept inside each and positions restarting at each start (padding-free, as TRL's); false: text "
        "windows run across documents, a conversation has a row to itself",
    )
    text_field: str = setting(
        "text", nonempty=True, doc="JSON Lines and datasets: the field (column) holding each document"
    )
    token_dtype: str = setting("uint16", choices=TOKEN_DTYPES, doc="pre-tokenized .bin files: the id type")
    suffixes: list[str] = setting(
        TEXT_SUFFIXES, items=FieldSpec(str, nonempty=True), doc="in a folder, the text files read (by suffix)"
    )
    val_fraction: float = setting(
        0.05,
        minimum=0.0,
        maximum=0.5,
        doc="documents held out for validation (chosen by a hash of their name: deterministic)",
    )
    cache_dir: str | None = setting(
        None, nonempty=True, doc="tokenized corpora (null: $TE_ASSEMBLY_CACHE or ~/.cache/te_assembly/tokens)"
    )
    tokenizer: TokenizerSettings = subsection(TokenizerSettings, doc="how text becomes token ids")

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], prefix: str = "data") -> DataSettings:
        return read_section(cls, raw, prefix)


__all__ = [
    "FORMATS",
    "TEXT_SUFFIXES",
    "TOKEN_DTYPES",
    "DataSettings",
    "TokenizerSettings",
]
