"""The prompts of ``generate.prompts_file``: a text file, one prompt a line, or JSON Lines whose every
line is a prompt string, ``{"prompt": ...}`` (a string, or a list of messages) or ``{"messages": [...]}``
(a conversation: rendered with the model's chat template, the assistant's turn next). Read through the
shared readers (``files/read.py`` limits, ``data/sources.json_records``), every bad line named."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from te_assembly.data.chat import check_messages
from te_assembly.data.sources import json_records
from te_assembly.errors import DataError
from te_assembly.files.read import LIMITS, InputFileError, read_text

JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")


@dataclass(frozen=True)
class Prompt:
    where: str
    """Its file and line."""
    text: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    """A conversation (``text`` is None)."""

    @property
    def given(self) -> Any:
        """As the file gave it (what the output record repeats)."""
        return self.text if self.messages is None else [dict(m) for m in self.messages]


def read_prompts(path: Path) -> list[Prompt]:
    """Every prompt of ``path`` (module docstring), or ``DataError`` naming the line at fault."""
    try:
        if path.suffix.lower() in JSON_SUFFIXES:
            prompts = [_prompt(where, record) for where, record in json_records(path)]
        else:
            text = read_text(path, limit=LIMITS["prompt"])
            prompts = [
                Prompt(f"{path}:{n}", line) for n, line in enumerate(text.splitlines(), 1) if line.strip()
            ]
    except InputFileError as exc:
        raise DataError(f"cannot read generate.prompts_file: {exc}") from None
    if not prompts:
        raise DataError(f"generate.prompts_file {path} holds no prompt")
    return prompts


def _prompt(where: str, record: Any) -> Prompt:
    if isinstance(record, dict):
        keys = [k for k in ("prompt", "messages") if k in record]
        if len(keys) != 1:
            raise DataError(f"{where}: a record has prompt or messages (one of them), not {sorted(record)}")
        record = record[keys[0]]
    if isinstance(record, str):
        return Prompt(where, record)
    if isinstance(record, list):
        try:
            check_messages(record, where)
        except DataError as exc:
            raise DataError(f"{where}: {exc}") from None
        return Prompt(where, messages=tuple({"role": m["role"], "content": m["content"]} for m in record))
    raise DataError(f"{where}: a prompt is a string or a list of messages, not {type(record).__name__}")


__all__ = ["Prompt", "read_prompts"]
