"""A tokenizer's chat template: the Jinja text a Hugging Face checkpoint ships (``chat_template.jinja``, or
``tokenizer_config.json``'s ``chat_template``) that turns a conversation into the model's prompt.

Rendered as ``transformers`` renders it (``trim_blocks``, ``lstrip_blocks``, the ``loopcontrols``
extension, ``raise_exception``, ``strftime_now``, a ``tojson`` that keeps non-ASCII text, the special
tokens of ``tokenizer_config.json`` as variables, ``{% generation %}`` blocks kept as text), in Jinja's
immutable sandbox: a template is code-like text from a download, so it may read the values it is given
but not reach Python attributes behind them (``__class__``...) or change them.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from te_assembly.data.tokenizer import HFTokenizer, load_tokenizer_file
from te_assembly.errors import DataError
from te_assembly.files.read import LIMITS, InputFileError, read_json, read_text

TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
ROLES = ("system", "user", "assistant", "tool")


class ChatTemplateError(DataError):
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
        from jinja2.exceptions import TemplateSyntaxError

        try:
            tokens = [
                (kind, value) for _, kind, value in _environment().lex(self.text) if kind != "whitespace"
            ]
        except TemplateSyntaxError:
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
        from jinja2.exceptions import SecurityError, TemplateError

        try:
            compiled = _environment(_mark).from_string(self.text)
            variables = {"tools": None, "documents": None, **self.tokens, **extra}
            return compiled.render(
                messages=list(messages), add_generation_prompt=add_generation_prompt, **variables
            )
        except ChatTemplateError:
            raise
        except SecurityError as exc:
            raise ChatTemplateError(
                f"{self.source}: the chat template tried something unsafe: {exc}"
            ) from None
        except TemplateError as exc:
            raise ChatTemplateError(f"{self.source}: the chat template failed: {exc}") from None


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


def _raise(message: str) -> None:
    raise ChatTemplateError(f"the chat template refused the conversation: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes HTML characters, which a prompt must keep as they are.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class _Dict:
    """``dict(...)`` for templates, without handing them the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


MARKS = ("\ue000", "\ue001")
"""Private-use characters around each ``{% generation %}`` block while its spans are found."""


def _environment(mark: bool = False) -> Any:
    from jinja2 import nodes, utils
    from jinja2.exceptions import SecurityError
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):  # type: ignore[misc]
        """``{% generation %}...{% endgeneration %}``: transformers marks the assistant's tokens with it;
        for a prompt its body is plain output."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            if mark:
                body = [
                    nodes.Output([nodes.TemplateData(MARKS[0])]),
                    *body,
                    nodes.Output([nodes.TemplateData(MARKS[1])]),
                ]
            return nodes.Scope(body, lineno=lineno)

    class Namespace(utils.Namespace):  # type: ignore[misc]
        """Jinja's ``namespace`` refusing ``_`` names, which lead towards Python's internals."""

        def __init__(*args: Any, **kwargs: Any) -> None:
            self, values = args[0], dict(*args[1:], **kwargs)
            for name in values:
                Namespace.check(name)
            utils.Namespace.__init__(self, values)

        def __setitem__(self, name: str, value: Any) -> None:
            Namespace.check(name)
            utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def check(name: object) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise SecurityError(f"a chat template may not store {name!r} on a namespace")

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise, strftime_now=_strftime_now, dict=_Dict(), namespace=Namespace)
    return env


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
        data = read_json(path, limit=LIMITS["tokenizer"], within=folder)
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
    "load_chat_template",
    "model_tokenizer",
    "special_tokens",
    "tokenizer_config",
]
