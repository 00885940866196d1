"""Each step's batch of a tokenized corpus, as a pure function of (seed, step).

A training batch is ``batch`` windows of ``seq_len + 1`` ids at positions drawn from a generator seeded
by (seed, step): ``x`` the first ``seq_len`` ids of each, ``labels`` the next-token targets (the window
shifted by one). So a resumed run sees exactly the batches an uninterrupted one would, without replaying
anything. Validation reads the same windows every time: consecutive, from the start of the held-out ids.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from te_assembly.data.batch_seeds import step_seed
from te_assembly.data.cache import Tokenized
from te_assembly.errors import DataError

IGNORE_INDEX = -100


@dataclass
class Corpus:
    data: Tokenized
    seq_len: int
    packing: bool = False
    """``data.packing``: each window also says where its documents are (each ends at an end-of-text
    token), and no position predicts across one's end."""

    @property
    def tokenizer(self):  # type: ignore[no-untyped-def]
        return self.data.tokenizer

    def check_fits(self, vocab: int, model: str) -> None:
        """``DataError`` when an id is beyond the model's vocabulary or a split is shorter than one
        sequence (with the numbers, and what to change)."""
        tok = self.data.tokenizer
        if tok.vocab_size > vocab:
            raise DataError(
                f"{model}'s vocabulary has {vocab} ids (in_features), the tokenizer "
                f"({self.data.meta['tokenizer']}) {tok.vocab_size}: token ids up to "
                f"{tok.vocab_size - 1} would be out of range; set "
                f"model.dims.vocab={_round_up(tok.vocab_size)} (or the model's in_features)"
            )
        need = self.seq_len + 1
        for name, ids in (("training", self.data.train), ("validation", self.data.val)):
            if name == "validation" and len(ids) == 0:
                continue
            if len(ids) < need:
                raise DataError(
                    f"the {name} split of {self.data.meta['sources']} has {len(ids)} tokens, fewer than one "
                    f"sequence of train.seq_len={self.seq_len} + 1: add text, lower train.seq_len"
                    + (" or data.val_fraction" if name == "validation" else "")
                )

    @property
    def has_validation(self) -> bool:
        return len(self.data.val) > self.seq_len

    def batch(self, seed: int, step: int, sequences: int, micro: int = 0) -> tuple[torch.Tensor, ...]:
        """``(x, labels)``, each ``[sequences, seq_len]`` int64 (``micro``: a micro-batch of ``step``)."""
        ids = self.data.train
        generator = torch.Generator().manual_seed(step_seed(seed, step, micro))
        starts = torch.randint(0, len(ids) - self.seq_len, (sequences,), generator=generator).tolist()
        return self._windows(ids, starts)

    @property
    def units(self) -> int:
        """What one pass over the training split is made of (``train.epochs``): its whole windows of
        ``seq_len`` tokens, side by side."""
        return (len(self.data.train) - 1) // self.seq_len

    @property
    def unit_words(self) -> str:
        return f"windows of {self.seq_len} tokens"

    def rows_of(self, units: list[int]) -> tuple[torch.Tensor, ...]:
        """``(x, labels)`` of the training windows ``units`` (``epoch_units``)."""
        return self._windows(self.data.train, [u * self.seq_len for u in units])

    def eval_batches(self, batches: int, sequences: int) -> list[tuple[torch.Tensor, ...]]:
        """Up to ``batches`` batches of consecutive validation windows (fewer when the split is short)."""
        ids = self.data.val
        windows = min(batches * sequences, (len(ids) - 1) // self.seq_len)
        starts = [i * self.seq_len for i in range(windows)]
        return [self._windows(ids, starts[i : i + sequences]) for i in range(0, len(starts), sequences)]

    def _windows(self, ids: np.ndarray, starts: list[int]) -> tuple[torch.Tensor, ...]:
        """``(x, labels)``; packed, ``(x, labels, documents)``: each position's document within its
        window (``engines/reference/packing.py``), a label only where the next token is the same
        document's."""
        rows = np.stack([np.asarray(ids[s : s + self.seq_len + 1], dtype=np.int64) for s in starts])
        block = torch.from_numpy(rows)
        x, labels = block[:, :-1].contiguous(), block[:, 1:].contiguous()
        if not self.packing:
            return x, labels
        ends = x == self.data.tokenizer.eot_id  # an end-of-text token ends its document
        documents = ends.cumsum(-1) - ends.long()
        return x, labels.masked_fill(ends, IGNORE_INDEX), documents

    @property
    def val_bytes_per_token(self) -> float | None:
        """UTF-8 bytes per validation token (for bits per byte); None for pre-tokenized data."""
        return bytes_per_token(self.data.meta, "val")


def bytes_per_token(meta: dict[str, Any], split: str) -> float | None:
    """UTF-8 bytes per token of a tokenized corpus's ``split`` (``train`` or ``val``, from its cache
    entry's ``meta``); None for pre-tokenized data, whose bytes are unknown, or an empty split."""
    counts = meta.get("bytes")
    tokens = meta["tokens"][split]
    if not counts or not tokens:
        return None
    return float(counts[split] / tokens)


def bits_per_byte(loss: float, bytes_per_token: float | None) -> float | None:
    """Cross-entropy in nats per token as bits per UTF-8 byte: comparable across tokenizers."""
    if bytes_per_token is None or bytes_per_token <= 0:
        return None
    return loss / math.log(2) / bytes_per_token


def _round_up(n: int, multiple: int = 16) -> int:
    return -(-n // multiple) * multiple


__all__ = ["Corpus", "bits_per_byte", "bytes_per_token"]
