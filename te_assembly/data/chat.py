"""A tokenizer's chat template: the Jinja text a Hugging Face checkpoint ships (``chat_template.jinja``, or
``tokenizer_config.json``'s ``chat_template``) that turns a conversation into the model's prompt.

Rendered by the one template renderer (``files/template.py``: as ``transformers`` renders it, in Jinja's
immutable sandbox, within bounds of time, size and recursion), with the special tokens of
``tokenizer_config.json`` as variables; every failure is a ``ChatTemplateError`` naming the template's
file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from te_assembly.data.tokenizer import HFTokenizer, load_tokenizer_file
from te_assembly.errors import DataError, TemplateError
from te_assembly.files.read import LIMITS, InputFileError, read_json, read_text
from te_assembly.files.template import MARKS, render_template, template_tokens

TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
ROLES = ("system", "user", "assistant", "tool")


class ChatTemplateError(DataError, TemplateError):
    """A template that cannot be read or rendered, or that raised (``raise_exception``) on a conversation."""


@dataclass(frozen=True)
class ChatTemplate:
    """A template and the special tokens it is rendered with."""

    text: str
    source: str
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def marks_generation(self) -> bool:
        """Whether the template marks the assistant's text with ``{% generation %}`` blocks, in any
        spelling Jinja accepts (``{%- generation +%}``...) and not inside a comment or a raw block: read
        from Jinja's own tokens, as the template is parsed."""
        try:
            tokens = template_tokens(self.text)
        except TemplateError:
            return False  # rendering names the syntax error
        return any(
            kind == "block_begin" and tokens[n + 1 : n + 2] == [("name", "generation")]
            for n, (kind, _) in enumerate(tokens)
        )

    def generation_spans(self, messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
        """The conversation rendered (no generation prompt) and the ``[start, end)`` characters of each
        ``{% generation %}`` block in it (what transformers' assistant-token mask covers)."""
        if any(MARKS[0] in str(m.get("content")) or MARKS[1] in str(m.get("content")) for m in messages):
            raise ChatTemplateError(f"{self.source}: a message holds a character reserved for marking turns")
        marked = self.render(messages, add_generation_prompt=False, _mark=True)
        text, spans, start = "", [], None
        for piece in re.split(f"([{MARKS[0]}{MARKS[1]}])", marked):
            if piece == MARKS[0]:
                start = len(text)
            elif piece == MARKS[1]:
                if start is not None:
                    spans.append((start, len(text)))
                start = None
            else:
                text += piece
        return text, spans

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        _mark: bool = False,
        **extra: Any,
    ) -> str:
        """The prompt for ``messages`` (``[{"role": ..., "content": ...}]``), with the opening of the
        assistant's turn when ``add_generation_prompt``."""
        check_messages(messages, self.source)
        variables = {"tools": None, "documents": None, **self.tokens, **extra}
        variables.update(messages=list(messages), add_generation_prompt=add_generation_prompt)
        try:
            return render_template(self.text, self.source, variables, mark=_mark)
        except TemplateError as exc:
            raise ChatTemplateError(str(exc)) from None


def check_messages(messages: Sequence[Mapping[str, Any]], source: str) -> None:
    """Each message a mapping with a known ``role`` and a string ``content``."""
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise ChatTemplateError(f"{source}: a conversation is a non-empty list of messages")
    for number, message in enumerate(messages, start=1):
        if not isinstance(message, Mapping):
            raise ChatTemplateError(f"message {number} is not a mapping with role and content")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise ChatTemplateError(f"message {number}: role {role!r} is not one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise ChatTemplateError(f"message {number}: content is not text")


def _token_text(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string, or ``{"content": ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def tokenizer_config(folder: Path) -> dict[str, Any]:
    """``folder``'s ``tokenizer_config.json`` (empty when there is none), read inside ``folder``."""
    path = folder / CONFIG_FILE
    if not (path.exists() or path.is_symlink()):
        return {}
    try:
        data = read_json(path, limit=LIMITS["metadata"], within=folder)
    except InputFileError as exc:
        raise ChatTemplateError(f"cannot read {path}: {exc}") from None
    return data if isinstance(data, dict) else {}


def special_tokens(folder: Path) -> dict[str, str]:
    """The special tokens ``tokenizer_config.json`` names (``bos_token``, ``eos_token``...)."""
    config = tokenizer_config(folder)
    found = {name: _token_text(config.get(name)) for name in SPECIAL_TOKENS}
    return {name: text for name, text in found.items() if text is not None}


def model_tokenizer(path: Path, eot: str, within: Path | None = None) -> HFTokenizer:
    """The ``tokenizer.json`` at ``path`` with ``eot`` as its end-of-text token; a tokenizer without one
    (Llama 3 ends a text with ``<|end_of_text|>``, an instruct model a turn with ``<|im_end|>``) is loaded
    with the ``eos_token`` of the ``tokenizer_config.json`` beside it instead."""
    try:
        return load_tokenizer_file(path, eot, within=within)
    except DataError:
        eos = special_tokens(path.parent).get("eos_token")
        if eos is None or eos == eot:
            raise
        return load_tokenizer_file(path, eos, within=within)


def has_chat_template(folder: Path) -> bool:
    """Whether ``folder`` (a model's) holds a chat template: an instruct model."""
    try:
        load_chat_template(folder)
    except ChatTemplateError:
        return False
    return True


def load_chat_template(folder: Path) -> ChatTemplate:
    """The chat template beside a tokenizer: ``chat_template.jinja``, else ``tokenizer_config.json``'s
    ``chat_template`` (a string, or named templates: ``default``); ``ChatTemplateError`` when there is
    none."""
    config = tokenizer_config(folder)
    path = folder / TEMPLATE_FILE
    if path.exists() or path.is_symlink():
        try:
            text = read_text(path, limit=LIMITS["tokenizer"], within=folder)
        except InputFileError as exc:
            raise ChatTemplateError(f"cannot read {path}: {exc}") from None
        return ChatTemplate(text, str(path), special_tokens(folder))
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    if not isinstance(template, str) or not template.strip():
        raise ChatTemplateError(
            f"{folder} has no chat template ({TEMPLATE_FILE}, or chat_template in {CONFIG_FILE}): "
            "generate.chat needs one (a base model's checkpoint usually has none; use its instruct version)"
        )
    return ChatTemplate(template, str(folder / CONFIG_FILE), special_tokens(folder))


__all__ = [
    "ROLES",
    "ChatTemplate",
    "ChatTemplateError",
    "check_messages",
    "has_chat_template",
    "load_chat_template",
    "model_tokenizer",
    "special_tokens",
    "tokenizer_config",
]
