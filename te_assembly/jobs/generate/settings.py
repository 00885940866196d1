"""The ``generate:`` section (pure Python: ``validate`` reads it without torch)."""

from __future__ import annotations

from dataclasses import dataclass

from te_assembly.fields import INT64_MAX, FieldSpec
from te_assembly.sections import setting


@dataclass(frozen=True)
class GenerateSettings:
    """``generate:``: the prompt, where the model comes from, and how tokens are chosen."""

    prompt: str | None = setting(None, doc="the text to continue (or prompt_file; null and no file: empty)")
    prompt_file: str | None = setting(None, nonempty=True, doc="read the prompt from this UTF-8 file")
    prompts_file: str | None = setting(
        None,
        nonempty=True,
        doc="many prompts, decoded in batches: a text file (one prompt a line) or JSON Lines (a string, "
        "{prompt: ...} or {messages: [...]}, a conversation in the chat template, per line); one JSON "
        "Lines record per prompt in the run directory's generations.jsonl",
    )
    batch_size: int = setting(8, minimum=1, doc="with prompts_file: prompts decoded together (left-padded)")
    source: str | None = setting(
        None,
        nonempty=True,
        doc="a run directory (its newest good checkpoint), a checkpoint file or a pretrained directory "
        "(null: a fresh model=... with the seed's random weights)",
    )
    max_new_tokens: int = setting(200, minimum=1, doc="tokens to generate at most")
    temperature: float = setting(0.8, minimum=0, doc="0: greedy (the most likely token every time)")
    top_k: int | None = setting(50, minimum=1, doc="sample among the k most likely tokens (null: all)")
    top_p: float | None = setting(
        0.95,
        minimum=0,
        exclusive_minimum=True,
        maximum=1,
        doc="nucleus sampling: the smallest set holding this probability",
    )
    seed: int | None = setting(None, minimum=0, maximum=INT64_MAX, doc="null: the top-level seed")
    context: int | None = setting(
        None,
        minimum=1,
        doc="positions the model sees, the last this many tokens, at most the model's context (null: the "
        "model's context, an imported model's max_position_embeddings; else 1024)",
    )
    stop_at_eot: bool = setting(
        True,
        doc="stop at the end-of-text token and at the model's eos_token_id (generation_config.json)",
    )
    stop: list[str] = setting(
        [],
        items=FieldSpec(str, nonempty=True),
        single_as_list=True,
        doc="stop strings: generation ends where one appears (it is cut from the text)",
    )
    chat: bool = setting(
        False, doc="the prompt is a user's message: rendered with the model's chat template (instruct models)"
    )
    system: str | None = setting(None, doc="with chat: the system prompt (null: none, or the template's own)")
    interactive: bool = setting(
        False, doc="with chat, on a terminal: read a message, answer, keep the conversation (empty line: end)"
    )
    tokenizer: str | None = setting(
        None, nonempty=True, doc="a tokenizer.json (null: the one beside the run or model, else byte-level)"
    )


__all__ = ["GenerateSettings"]
