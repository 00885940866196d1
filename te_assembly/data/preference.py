"""Preference data (``data.format=preference``): JSON Lines of ``{"prompt": ..., "chosen": ...,
"rejected": ...}``, for DPO (``train.objective=dpo``).

Each of the three is a string, or a list of messages (a conversation: the prompt's turns, then the
chosen or rejected answer's). As TRL tokenizes a pair: a conversation's prompt is rendered with the
model's chat template and the opening of the assistant's turn, its answer is what the whole conversation
renders beyond that prompt (the template's end of turn included); a plain answer ends with the
end-of-text token. The prompt's tokens, then the answer's: the answer's are the labels (every other
label -100), and both rows of a pair are cut to ``seq_len + 1`` tokens. A pair whose answer is cut away
entirely teaches nothing and is left out (counted). Batches are ``pairs`` pairs, the chosen rows first,
then the rejected rows in the same order: a pure function of (seed, step) as for text, or, with
``train.epochs``, a walk through the pairs (``units``, ``rows_of``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
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
from te_assembly.data.conversations import IGNORE
from te_assembly.data.examples import ExampleCorpus
from te_assembly.data.settings import DataSettings
from te_assembly.data.sources import find_sources, json_records
from te_assembly.data.tokenizer import ByteTokenizer, Tokenizer
from te_assembly.errors import DataError

FIELDS = ("prompt", "chosen", "rejected")


@dataclass(frozen=True)
class Pair:
    where: str
    chosen: tuple[list[int], int]
    """The chosen row's ids and where its answer starts."""
    rejected: tuple[list[int], int]


@dataclass
class PreferenceCorpus(ExampleCorpus):
    """Preference pairs as training examples (module docstring); what ``Corpus`` offers a task."""

    train: list[Pair]
    val: list[Pair]
    tokenizer: Tokenizer
    seq_len: int
    meta: dict[str, Any]
    unit_words = "preference pairs"
    rows_per_unit = 2

    @classmethod
    def prepare(cls, settings: DataSettings, seq_len: int) -> PreferenceCorpus:
        tokenizer, template = _tokenizer_and_template(settings)
        sources = find_sources(settings)
        if sources.kind != "text":
            raise DataError(f"data.format=preference reads JSON Lines of pairs; {sources.description} is not")
        train: list[Pair] = []
        val: list[Pair] = []
        digest = hashlib.sha256()
        cut = 0
        for path in sources.files:
            for where, record in json_records(path):
                prompt, answers, plain = _texts(where, record, template)
                digest.update(json_digest(prompt, answers))
                end = tokenizer.eot_id if plain and tokenizer.eot_id >= 0 else None
                rows = tuple(_row(tokenizer, prompt, answer, end, seq_len + 1) for answer in answers)
                if any(start >= len(ids) for ids, start in rows):  # no answer token inside the window
                    cut += 1
                    continue
                pair = Pair(where, rows[0], rows[1])
                (val if is_validation(where, settings.val_fraction) else train).append(pair)
        if not train and val:
            train.append(val.pop())
        meta = {
            "sources": f"data.path={settings.path} (preference pairs)",
            "sources_sha256": digest.hexdigest(),
            "tokenizer": tokenizer.fingerprint,
            "pairs": {"train": len(train), "val": len(val), "answers_past_seq_len": cut},
        }
        return cls(train, val, tokenizer, seq_len, meta)

    def nothing_to_learn(self) -> str:
        return (
            f"has no pair whose answers start within train.seq_len={self.seq_len} tokens: nothing to learn "
            "(shorten the prompts or raise train.seq_len)"
        )

    @property
    def units(self) -> int:
        return len(self.train)

    def rows_of(self, units: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rows([self.train[u] for u in units])

    def batch(
        self, seed: int, step: int, sequences: int, micro: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``sequences`` rows: ``sequences // 2`` pairs (at least one)."""
        generator = torch.Generator().manual_seed(step_seed(seed, step, micro))
        chosen = torch.randint(0, len(self.train), (max(1, sequences // 2),), generator=generator).tolist()
        return self.rows([self.train[i] for i in chosen])

    def eval_batches(self, batches: int, sequences: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        per = max(1, sequences // 2)
        pairs = self.val[: batches * per]
        return [self.rows(pairs[i : i + per]) for i in range(0, len(pairs), per)]

    def rows(self, pairs: Sequence[Pair]) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` and ``labels`` ``[2 * len(pairs), seq_len]``: the chosen rows, then the rejected rows,
        each padded with the end-of-text id after its end; a label only on the answer's tokens."""
        rows = [p.chosen for p in pairs] + [p.rejected for p in pairs]
        x = np.full((len(rows), self.seq_len), max(self.tokenizer.eot_id, 0), dtype=np.int64)
        labels = np.full((len(rows), self.seq_len), IGNORE, dtype=np.int64)
        for row, (ids, start) in enumerate(rows):
            n = len(ids) - 1
            x[row, :n] = ids[:n]
            labels[row, :n] = ids[1 : n + 1]
            labels[row, : max(start - 1, 0)] = IGNORE  # the prompt's tokens predict nothing learnt
        return torch.from_numpy(x), torch.from_numpy(labels)


def json_digest(prompt: str, answers: Sequence[str]) -> bytes:
    return "\0".join([prompt, *answers]).encode() + b"\1"


def _tokenizer_and_template(settings: DataSettings) -> tuple[Tokenizer, ChatTemplate | None]:
    """The model's tokenizer (and chat template, where its folder has one), or byte-level."""
    path = settings.tokenizer.path
    if path is None:
        return ByteTokenizer(), None
    folder = Path(path).expanduser().parent
    tokenizer = model_tokenizer(Path(path).expanduser(), settings.tokenizer.eot)
    try:
        return tokenizer, load_chat_template(folder)
    except ChatTemplateError:
        return tokenizer, None  # plain-text pairs need none; a conversation says so


def _texts(where: str, record: Any, template: ChatTemplate | None) -> tuple[str, tuple[str, str], bool]:
    """The prompt's text, the two answers', and whether they are plain text (module docstring)."""
    if not isinstance(record, dict) or any(f not in record for f in FIELDS):
        keys = ", ".join(sorted(record)) if isinstance(record, dict) else type(record).__name__
        raise DataError(f"{where}: a pair has prompt, chosen and rejected (it has: {keys})")
    values = [record[f] for f in FIELDS]
    if all(isinstance(v, str) for v in values):
        return values[0], (values[1], values[2]), True
    if not all(isinstance(v, list) for v in values):
        raise DataError(f"{where}: prompt, chosen and rejected are all strings or all lists of messages")
    if template is None:
        raise DataError(
            f"{where}: a conversation is rendered with the model's chat template, and none is beside "
            "data.tokenizer.path (tokenizer_config.json or chat_template.jinja)"
        )
    try:
        for name, messages in zip(FIELDS, values, strict=True):
            check_messages(messages, f"{where}: {name}")
        prompt = template.render(values[0], add_generation_prompt=True)
        answers = []
        for answer in values[1:]:
            whole = template.render([*values[0], *answer], add_generation_prompt=False)
            if not whole.startswith(prompt):
                raise ChatTemplateError("the conversation does not start with its prompt's rendering")
            answers.append(whole[len(prompt) :])
    except ChatTemplateError as exc:
        raise DataError(f"{where}: {exc}") from None
    return prompt, (answers[0], answers[1]), False


def _row(
    tokenizer: Tokenizer, prompt: str, answer: str, end: int | None, limit: int
) -> tuple[list[int], int]:
    """The prompt's ids then the answer's (and ``end``), at most ``limit``; where the answer starts."""
    first = list(tokenizer.encode(prompt))
    ids = (first + list(tokenizer.encode(answer)) + ([end] if end is not None else []))[:limit]
    return ids, len(first)


__all__ = ["FIELDS", "Pair", "PreferenceCorpus"]
