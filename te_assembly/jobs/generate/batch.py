"""``generate.prompts_file``: many prompts (``prompts.py``) continued in left-padded batches of
``generate.batch_size`` through the key/value cache (``generate_many``: greedy gives each prompt the
tokens it gets alone), the model loaded once. Each prompt's result is one JSON Lines record of
``generations.jsonl`` in the run directory, in the file's order; the file is rewritten whole after every
batch (``files/write.py``), so a run stopped midway keeps every batch it finished."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from te_assembly.data.tokenizer import Tokenizer
from te_assembly.engines.base import AssembledModel
from te_assembly.engines.target import Target, as_target
from te_assembly.files.write import write_text_atomic
from te_assembly.jobs.events import Advanced, OnEvent, ignore
from te_assembly.jobs.generate.job import (
    Generated,
    chat_template_for,
    conversation,
    generate_many,
    load_source,
    tokenizer_for,
)
from te_assembly.jobs.generate.prompts import Prompt, read_prompts
from te_assembly.jobs.generate.settings import GenerateSettings

GENERATIONS_FILE = "generations.jsonl"


@dataclass(frozen=True)
class Batched:
    """What ``generate_file`` wrote."""

    path: Path
    prompts: int
    tokens: int
    seconds: float


def generate_file(
    model: AssembledModel | str | os.PathLike[str],
    target: Target | str,
    settings: GenerateSettings,
    out_dir: str | os.PathLike[str],
    *,
    tokenizer: Tokenizer | None = None,
    source: str | os.PathLike[str] | None = None,
    on_event: OnEvent = ignore,
) -> Batched:
    """Continue every prompt of ``settings.prompts_file`` into ``out_dir/generations.jsonl`` (module
    docstring); ``on_event`` gets ``Advanced("generate", prompts done, prompts)`` after each batch.
    ``model``, ``tokenizer`` and ``source`` as ``generate``'s."""
    assert settings.prompts_file is not None, "generate_file reads generate.prompts_file"
    prompts = read_prompts(Path(settings.prompts_file).expanduser())
    target = as_target(target)
    where = Path(source).expanduser() if source is not None else None
    if not isinstance(model, AssembledModel):
        where = Path(model).expanduser()
        model = load_source(str(model), target)
    tokenizer = tokenizer if tokenizer is not None else tokenizer_for(where, settings)
    texts = _rendered(prompts, settings, where)
    plain = dataclasses.replace(settings, chat=False, prompt=None, prompt_file=None, prompts_file=None)
    path = Path(out_dir) / GENERATIONS_FILE
    lines: list[str] = []
    tokens, seconds = 0, 0.0
    for start in range(0, len(prompts), settings.batch_size):
        batch = texts[start : start + settings.batch_size]
        results = generate_many(model, target, batch, plain, tokenizer=tokenizer, source=where)
        for index, (prompt, result) in enumerate(zip(prompts[start:], results, strict=False), start):
            lines.append(json.dumps(_record(index, prompt, result), ensure_ascii=False) + "\n")
            tokens += len(result.ids)
        seconds += results[0].seconds
        write_text_atomic(path, "".join(lines))
        on_event(Advanced("generate", len(lines), len(prompts)))
    return Batched(path, len(prompts), tokens, seconds)


def _rendered(prompts: list[Prompt], settings: GenerateSettings, source: Path | None) -> list[str]:
    """Each prompt as the model reads it: a conversation (or, with ``generate.chat``, a line as the
    user's message) through the chat template; a plain prompt as it is."""
    if not settings.chat and all(p.messages is None for p in prompts):
        return [p.text or "" for p in prompts]
    template = chat_template_for(source, settings)
    out = []
    for p in prompts:
        if p.messages is not None:
            out.append(template.render(list(p.messages)))
        else:
            out.append(
                template.render(conversation(p.text or "", settings.system))
                if settings.chat
                else p.text or ""
            )
    return out


def _record(index: int, prompt: Prompt, result: Generated) -> dict[str, Any]:
    stopped = "stop" if result.stop_string is not None else "eot" if result.stopped_at_eot else "length"
    return {
        "index": index,
        "where": prompt.where,
        "prompt": prompt.given,
        "text": result.text,
        "tokens": len(result.ids),
        "stopped": stopped,
        "stop_string": result.stop_string,
    }


__all__ = ["GENERATIONS_FILE", "Batched", "generate_file"]
