"""Instruction data: JSON Lines of conversations (``{"messages": [{"role": ..., "content": ...}, ...]}``),
rendered with the model's chat template, with the loss on the assistant's tokens only.

Each conversation is one example, alone in its row: rendered, its first ``seq_len + 1`` tokens taken
(only as much of the text is tokenized, and only the turns in that window are found, as they need),
padded after its end (padding is never a label and, attention being causal, never seen by a
real token), so attention stays within the example. A token is the assistant's when the characters it
starts at lie in an assistant turn: the text each assistant message adds to the rendered conversation
(``render(messages[:i+1])`` minus ``render(messages[:i], add_generation_prompt=True)``: its content and
the template's end of turn, as ``transformers`` marks them with ``{% generation %}``). Every other label
is -100. Batches are a pure function of (seed, step), as for text (``Corpus``); held-out examples are
chosen by a hash of their name (``data.val_fraction``).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from te_assembly.data.batch_seeds import step_seed
from te_assembly.data.cache import is_validation
from te_assembly.data.chat import (
    ChatTemplate,
    ChatTemplateError,
    check_messages,
    load_chat_template,
    model_tokenizer,
)
from te_assembly.data.examples import ExampleCorpus
from te_assembly.data.settings import DataSettings
from te_assembly.data.sources import find_sources, json_records
from te_assembly.data.tokenizer import Tokenizer
from te_assembly.errors import DataError

IGNORE = -100
MESSAGES = "messages"


@dataclass(frozen=True)
class Example:
    name: str
    """Its file and line."""
    ids: np.ndarray
    """The rendered conversation's tokens (at most ``seq_len + 1``)."""
    assistant: np.ndarray
    """Whether each token is the assistant's (a label)."""


def assistant_spans(
    template: ChatTemplate,
    messages: Sequence[dict[str, Any]],
    where: str,
    window: Callable[[str], int] | None = None,
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the ``[start, end)`` characters of each assistant turn in it: the
    template's own ``{% generation %}`` blocks where it has them, else what each assistant message adds.
    ``window``: given the rendered conversation, the character before which turns are wanted (the rest
    lie past the window), so a conversation of thousands of turns is not rendered turn by turn to its
    end."""
    check_messages(messages, where)
    if template.marks_generation:
        return template.generation_spans(messages)
    full = template.render(messages, add_generation_prompt=False)
    within = window(full) if window is not None else None
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = template.render(messages[:index], add_generation_prompt=True) if index else ""
        if within is not None and len(before) >= within:
            break
        through = template.render(messages[: index + 1], add_generation_prompt=False)
        if not through.startswith(before) or not full.startswith(through):
            raise DataError(
                f"{where}: the chat template does not render this conversation turn by turn (an earlier "
                "turn's text changes when later turns are added), so its assistant tokens cannot be found"
            )
        spans.append((len(before), len(through)))
    return full, spans


MARGIN = 64
"""Tokens past the ones kept that a prefix of the text must give before it is trusted: only tokens near
its cut can differ from those of the whole text."""


def first_tokens(tokenizer: Tokenizer, text: str, limit: int) -> tuple[list[int], list[tuple[int, int]]]:
    """The first ``limit`` tokens of ``text`` and their character offsets, tokenizing only as much of it
    as they need (a prefix, doubled until it gives ``MARGIN`` tokens more): a conversation far longer
    than the window costs what the window costs."""
    size = max(4096, 16 * (limit + MARGIN))
    while True:
        ids, offsets = tokenizer.encode_offsets(text[:size])
        if size >= len(text) or len(ids) >= limit + MARGIN:
            return ids[:limit], offsets[:limit]
        size *= 2


def tokenized(
    tokenizer: Tokenizer, text: str, spans: Sequence[tuple[int, int]], limit: int
) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of ``text`` (at most ``limit``) and whether each starts inside one of ``spans``."""
    return labelled(*first_tokens(tokenizer, text, limit), spans)


def labelled(
    ids: Sequence[int], offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]
) -> tuple[np.ndarray, np.ndarray]:
    """``ids`` as an array, and whether each token (its ``offsets``) starts inside one of ``spans``."""
    inside = np.zeros(len(ids), dtype=bool)
    for number, (start, _) in enumerate(offsets):
        inside[number] = any(a <= start < b for a, b in spans)
    return np.asarray(ids, dtype=np.int64), inside


class _Window:
    """Where a rendered conversation's window ends (``assistant_spans``' ``window``), from its first
    tokens, which are kept for the labels: the text is tokenized once."""

    def __init__(self, tokenizer: Tokenizer, limit: int) -> None:
        self.tokenizer, self.limit = tokenizer, limit
        self.tokens: tuple[list[int], list[tuple[int, int]]] | None = None

    def __call__(self, text: str) -> int:
        self.tokens = first_tokens(self.tokenizer, text, self.limit)
        offsets = self.tokens[1]
        return offsets[-1][1] if len(offsets) == self.limit else len(text)


def conversations(settings: DataSettings) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """``(name, messages)`` of every record of the JSON Lines files ``data.path`` names."""
    sources = find_sources(settings)
    if sources.kind != "text":
        raise DataError(f"data.format=chat reads JSON Lines of conversations; {sources.description} is not")
    for path in sources.files:
        for where, record in json_records(path):
            if not isinstance(record, dict) or not isinstance(record.get(MESSAGES), list):
                raise DataError(
                    f"{where} has no {MESSAGES!r} list (a conversation: [{{role, content}}, ...])"
                )
            yield where, record[MESSAGES]


@dataclass
class ChatCorpus(ExampleCorpus):
    """Conversations as training examples (module docstring); what ``Corpus`` offers a ``LanguageTask``."""

    train: list[Example]
    val: list[Example]
    tokenizer: Tokenizer
    seq_len: int
    meta: dict[str, Any]
    packing: bool = False
    """``data.packing``: conversations side by side in each row (``packed``), each its own document."""

    @classmethod
    def prepare(
        cls, settings: DataSettings, seq_len: int, progress: Callable[[int, int], None] | None = None
    ) -> ChatCorpus:
        path = settings.tokenizer.path
        if path is None:
            raise DataError(
                "data.format=chat renders conversations with the model's chat template: set "
                "data.tokenizer.path to the model's tokenizer.json (its folder holds the template: "
                "tokenizer_config.json or chat_template.jinja)"
            )
        folder = Path(path).expanduser().parent
        tokenizer = model_tokenizer(Path(path).expanduser(), settings.tokenizer.eot)
        template = load_chat_template(folder)
        train: list[Example] = []
        val: list[Example] = []
        digest = hashlib.sha256(template.text.encode())
        unlabelled = 0
        for where, messages in conversations(settings):
            window = _Window(tokenizer, seq_len + 1)
            try:
                text, spans = assistant_spans(template, messages, where, window)
            except ChatTemplateError as exc:
                raise DataError(f"{where}: {exc}") from None
            tokens = window.tokens or first_tokens(tokenizer, text, seq_len + 1)
            ids, assistant = labelled(*tokens, spans)
            digest.update(text.encode() + b"\0")
            if not assistant[1:].any():  # no answer within the window: nothing to learn from it
                unlabelled += 1
                continue
            example = Example(where, ids, assistant)
            (val if is_validation(where, settings.val_fraction) else train).append(example)
            if progress is not None:
                progress(len(train) + len(val), 0)
        if not train and val:
            train.append(val.pop())
        meta = {
            "sources": f"data.path={settings.path} (conversations)",
            "sources_sha256": digest.hexdigest(),
            "tokenizer": tokenizer.fingerprint,
            "examples": {"train": len(train), "val": len(val), "without_answers": unlabelled},
        }
        return cls(train, val, tokenizer, seq_len, meta, settings.packing)

    def nothing_to_learn(self) -> str:
        return (
            f"has no assistant tokens within train.seq_len={self.seq_len} of any conversation: nothing to "
            "learn (add assistant turns or raise train.seq_len)"
        )

    def batch(self, seed: int, step: int, sequences: int, micro: int = 0) -> tuple[torch.Tensor, ...]:
        generator = torch.Generator().manual_seed(step_seed(seed, step, micro))
        chosen = torch.randint(0, self.units, (sequences,), generator=generator).tolist()
        return self.rows_of(chosen)

    @property
    def units(self) -> int:
        """What one pass over the training split is made of (``train.epochs``): its conversations, or
        packed, its rows."""
        return len(self.packed_train) if self.packing else len(self.train)

    @property
    def unit_words(self) -> str:
        return "rows of packed conversations" if self.packing else "conversations"

    @functools.cached_property
    def packed_train(self) -> list[list[Example]]:
        return pack(self.train, self.seq_len)

    def rows_of(self, units: list[int]) -> tuple[torch.Tensor, ...]:
        """``(x, labels)`` of the training conversations ``units`` (``epoch_units``); packed, ``(x,
        labels, documents)`` of those packed rows."""
        if self.packing:
            return self.packed_rows([self.packed_train[u] for u in units])
        return self.rows([self.train[u] for u in units])

    def eval_batches(self, batches: int, sequences: int) -> list[tuple[torch.Tensor, ...]]:
        if self.packing:
            rows = pack(self.val, self.seq_len)[: batches * sequences]
            return [self.packed_rows(rows[i : i + sequences]) for i in range(0, len(rows), sequences)]
        examples = self.val[: batches * sequences]
        return [self.rows(examples[i : i + sequences]) for i in range(0, len(examples), sequences)]

    def packed_rows(self, rows: Sequence[Sequence[Example]]) -> tuple[torch.Tensor, ...]:
        """``x``, ``labels`` and ``documents`` ``[len(rows), seq_len]``: each row's conversations one
        after another, each its own document (``engines/reference/packing.py``), padding (-1) after."""
        x = np.full((len(rows), self.seq_len), max(self.tokenizer.eot_id, 0), dtype=np.int64)
        labels = np.full((len(rows), self.seq_len), IGNORE, dtype=np.int64)
        documents = np.full((len(rows), self.seq_len), -1, dtype=np.int64)
        for r, row in enumerate(rows):
            at = 0
            for d, example in enumerate(row):
                n = len(example.ids) - 1
                x[r, at : at + n] = example.ids[:n]
                kept = np.where(example.assistant[1 : n + 1], example.ids[1 : n + 1], IGNORE)
                labels[r, at : at + n] = kept
                documents[r, at : at + n] = d
                at += n
        return torch.from_numpy(x), torch.from_numpy(labels), torch.from_numpy(documents)

    def rows(self, examples: Sequence[Example]) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` and ``labels`` ``[len(examples), seq_len]``: each example from the row's start, padded
        with the end-of-text id after its end; a label only where the next token is the assistant's."""
        x, labels, _ = self.packed_rows([[example] for example in examples])  # one conversation a row
        return x, labels


def pack(examples: Sequence[Example], seq_len: int) -> list[list[Example]]:
    """``examples`` in order, as many to a row as fit in ``seq_len`` positions (each takes its length
    less one: its last token predicts nothing); a row is closed when the next would not fit."""
    rows: list[list[Example]] = []
    current: list[Example] = []
    used = 0
    for example in examples:
        n = len(example.ids) - 1
        if n <= 0:
            continue
        if current and used + n > seq_len:
            rows.append(current)
            current, used = [], 0
        current.append(example)
        used += n
    if current:
        rows.append(current)
    return rows


__all__ = [
    "IGNORE",
    "ChatCorpus",
    "Example",
    "assistant_spans",
    "conversations",
    "labelled",
    "pack",
    "tokenized",
]
