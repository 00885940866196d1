"""What a corpus of whole examples (conversations, preference pairs: one example a row, or packed) offers
a language task beside its rows, written once for each kind of example."""

from __future__ import annotations

from typing import Any

from te_assembly.data.tokenizer import Tokenizer
from te_assembly.errors import DataError


class ExampleCorpus:
    """``train`` and ``val`` examples, the model's ``tokenizer``, ``seq_len`` and ``meta``; a subclass
    says what an empty training split lacks (``nothing_to_learn``)."""

    train: list[Any]
    val: list[Any]
    tokenizer: Tokenizer
    seq_len: int
    meta: dict[str, Any]

    @property
    def data(self) -> Any:
        return self  # the run record reads ``corpus.data.meta``, as for a tokenized text

    def nothing_to_learn(self) -> str:
        raise NotImplementedError

    def check_fits(self, vocab: int, model: str) -> None:
        if self.tokenizer.vocab_size > vocab:
            raise DataError(
                f"{model}'s vocabulary has {vocab} ids, the tokenizer {self.tokenizer.vocab_size}: it is not "
                "the model's own tokenizer"
            )
        if not self.train:
            raise DataError(f"{self.meta['sources']} {self.nothing_to_learn()}")

    @property
    def has_validation(self) -> bool:
        return bool(self.val)

    @property
    def val_bytes_per_token(self) -> float | None:
        return None  # examples are rendered text: no byte count per token is kept


__all__ = ["ExampleCorpus"]
