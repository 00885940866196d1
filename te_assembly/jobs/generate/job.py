"""``generate``: a language model continues a prompt (or a batch of prompts), one token at a time.

Each new token comes from the model's logits at the last position of the sequence so far (the last
``context`` tokens of it), computed with a key/value cache (``decode.py``): the prompt once, then one
position per token. Greedy (``temperature=0``) takes the argmax; otherwise the logits are divided by
the temperature, cut to the ``top_k`` most likely ids and the smallest set holding ``top_p`` of the
probability, and sampled from a generator seeded by ``seed``: the same seed gives the same text.
Generation stops at ``max_new_tokens``, a stop id (the end-of-text token, the model's
``eos_token_id``s) or a ``stop`` string.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from te_assembly.data.chat import ChatTemplate, load_chat_template, model_tokenizer
from te_assembly.data.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer_file
from te_assembly.engines.base import AssembledModel
from te_assembly.engines.target import Target, as_target
from te_assembly.errors import ArgumentError, CheckpointError, DataError
from te_assembly.files.directory import recover
from te_assembly.files.read import LIMITS, InputFileError, read_text
from te_assembly.formats.companions import GENERATION_CONFIG, SOURCE_CONFIG, companion_json
from te_assembly.formats.tokenizer_record import check_tokenizer
from te_assembly.jobs.events import OnEvent, ignore
from te_assembly.jobs.generate.decode import decode
from te_assembly.jobs.generate.settings import GenerateSettings
from te_assembly.jobs.window import window


@dataclass
class Generated:
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    """The new tokens (the stop token, if it stopped at one, not included)."""
    text: str = ""
    stopped_at_eot: bool = False
    """It stopped at a stop token: the tokenizer's end-of-text or an ``eos_token_id`` of the model's."""
    stop_string: str | None = None
    """The ``generate.stop`` string it stopped at (cut from ``text``)."""
    seconds: float = 0.0
    """Wall time of the whole generation (the batch's, for ``generate_many``)."""

    @property
    def tokens_per_s(self) -> float:
        return len(self.ids) / self.seconds if self.seconds > 0 else 0.0


def next_token(logits: torch.Tensor, settings: GenerateSettings, generator: torch.Generator) -> int:
    """One id from the last position's ``logits`` ``[vocab]`` (module docstring)."""
    if settings.temperature == 0:
        return int(logits.argmax())
    logits = logits.double()
    # Shifted first, so the most likely id is 0 and a tiny temperature (1e-45) divides nothing into an
    # infinity: the others go to -inf and sampling becomes greedy, as the limit is.
    logits = (logits - logits.max()) / settings.temperature
    if settings.top_k is not None and settings.top_k < logits.numel():
        kth = torch.topk(logits, settings.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if settings.top_p is not None and settings.top_p < 1:
        ordered, order = probs.sort(descending=True)
        before = ordered.cumsum(0) - ordered  # the probability of the ids ranked above each
        ordered = ordered.masked_fill(before >= settings.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(0, order, ordered)
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


@dataclass(frozen=True)
class Text:
    """The event of each new piece of text, as soon as it is decided (the stream)."""

    text: str


def generate(
    model: AssembledModel | str | os.PathLike[str],
    target: Target | str,
    settings: GenerateSettings | None = None,
    *,
    tokenizer: Tokenizer | str | os.PathLike[str] | None = None,
    source: str | os.PathLike[str] | None = None,
    on_event: OnEvent = ignore,
) -> Generated:
    """Continue ``settings.prompt`` (or ``prompt_file``) with ``model`` (module docstring; ``settings``:
    ``GenerateSettings()`` when None). ``model``: a built model, or a run directory, checkpoint or
    pretrained directory loaded on ``target`` (``load_source``); ``target.seed`` seeds the sampling
    unless ``settings.seed`` does. ``tokenizer``: a tokenizer, a ``tokenizer.json``, or a run or
    pretrained directory (its ``tokenizer.json``, else byte-level); None: ``settings.tokenizer``, else the
    one beside a loaded source, else byte-level. ``source``: where a built ``model`` was loaded from
    (its stop ids and recorded tokenizer). ``on_event`` gets a ``Text`` event per new piece."""
    return _generate(model, target, settings, tokenizer, source, on_event, None)[0]


def generate_many(
    model: AssembledModel | str | os.PathLike[str],
    target: Target | str,
    prompts: Sequence[str],
    settings: GenerateSettings | None = None,
    *,
    tokenizer: Tokenizer | str | os.PathLike[str] | None = None,
    source: str | os.PathLike[str] | None = None,
) -> list[Generated]:
    """``generate`` for several prompts at once: one batch, left-padded to the longest prompt, each
    continued as it would be alone (greedy: the same tokens; sampling draws each row in turn)."""
    return _generate(model, target, settings, tokenizer, source, ignore, list(prompts))


def chat(
    model: AssembledModel | str | os.PathLike[str],
    target: Target | str,
    messages: Sequence[dict[str, str]],
    settings: GenerateSettings | None = None,
    *,
    tokenizer: Tokenizer | str | os.PathLike[str] | None = None,
    source: str | os.PathLike[str] | None = None,
    on_event: OnEvent = ignore,
) -> Generated:
    """The assistant's next turn in the conversation ``messages`` (``[{"role": "user", "content":
    ...}, ...]``), rendered with the chat template beside the model (``generate.tokenizer``'s folder, else
    ``source``'s, else ``model``'s when it is a path); otherwise as ``generate``."""
    settings = settings if settings is not None else GenerateSettings()
    where = source if source is not None else None if isinstance(model, AssembledModel) else model
    template = chat_template_for(Path(where).expanduser() if where is not None else None, settings)
    rendered = template.render(messages)
    plain = dataclasses.replace(settings, chat=False, prompt=None, prompt_file=None)
    return _generate(model, target, plain, tokenizer, source, on_event, [rendered])[0]


def _generate(
    model: AssembledModel | str | os.PathLike[str],
    target: Target | str,
    settings: GenerateSettings | None,
    tokenizer: Tokenizer | str | os.PathLike[str] | None,
    given_source: str | os.PathLike[str] | None,
    on_event: OnEvent,
    prompts: list[str] | None,
) -> list[Generated]:
    settings = settings if settings is not None else GenerateSettings()
    target = as_target(target)
    source = Path(given_source).expanduser() if given_source is not None else None
    if not isinstance(model, AssembledModel):
        source = Path(model).expanduser()
        model = load_source(str(model), target)
    if tokenizer is None:
        tokenizer = tokenizer_for(source, settings)
    elif isinstance(tokenizer, (str, os.PathLike)):
        path = Path(tokenizer).expanduser()
        if path.is_dir():
            tokenizer = tokenizer_for(path, settings)
        else:
            tokenizer = load_tokenizer_file(path, "<|endoftext|>")
            if source is not None:
                check_tokenizer(source, tokenizer, "generate.source")
    plan = model.plan
    if not plan.takes_token_ids or plan.out_features != plan.in_features:
        raise ArgumentError(
            f"{plan.name} is not a language model (token ids in, logits over its vocabulary out): nothing "
            "to generate with; e.g. model=dense_lm"
        )
    if tokenizer.vocab_size > plan.in_features:
        raise DataError(
            f"the tokenizer has {tokenizer.vocab_size} ids, {plan.name}'s vocabulary {plan.in_features}: "
            "this tokenizer is not the one the model was trained with"
        )
    context = window(settings.context, source, "generate.context", plan.name)
    settings = dataclasses.replace(settings, context=context)
    seed = settings.seed if settings.seed is not None else target.seed
    if prompts is None:
        prompts = [read_prompt(settings)]
    if not prompts or not all(isinstance(p, str) for p in prompts):
        raise ArgumentError("generate_many takes a non-empty list of prompt strings")
    if settings.chat:
        template = chat_template_for(source, settings)
        prompts = [template.render(conversation(p, settings.system)) for p in prompts]
    stop_ids = stop_ids_of(source, tokenizer, settings)
    return _continue(model, tokenizer, prompts, settings, seed, on_event, stop_ids)


def _continue(
    model: AssembledModel,
    tokenizer: Tokenizer,
    prompts: list[str],
    settings: GenerateSettings,
    seed: int,
    on_event: OnEvent,
    stop_ids: frozenset[int],
) -> list[Generated]:
    results = [Generated(list(tokenizer.encode(p))) for p in prompts]
    # An empty prompt starts a document.
    start = [tokenizer.eot_id] if tokenizer.eot_id >= 0 else [0]
    streams = [_Stream(tokenizer, settings.stop, on_event if len(prompts) == 1 else ignore) for _ in prompts]

    def on_token(row: int, token: int) -> bool:
        results[row].ids.append(token)
        return streams[row].add(results[row])

    decoded = decode(
        model,
        [r.prompt_ids or start for r in results],
        settings,
        torch.Generator().manual_seed(seed),
        next_token,
        stop_ids,
        on_token,
    )
    for result, stream, stopped in zip(results, streams, decoded.stopped, strict=True):
        result.stopped_at_eot = stopped is not None
        result.seconds = decoded.seconds
        stream.finish(result)
    return results


class _Stream:
    """One sequence's text as it grows: shown once each piece is whole (a byte-level id can end inside
    a UTF-8 character) and cannot be the start of a stop string; cut at the first stop string."""

    def __init__(self, tokenizer: Tokenizer, stops: Sequence[str], on_event: OnEvent) -> None:
        self.tokenizer, self.stops, self.on_event = tokenizer, [s for s in stops if s], on_event
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.shown = ""

    def add(self, result: Generated) -> bool:
        """Show what is decided of ``result``'s text; True when a stop string ended it."""
        text = self.tokenizer.decode(result.ids)
        found = [(text.find(s), s) for s in self.stops if s in text]
        if found:
            at, stop = min(found)
            result.stop_string, result.text = stop, text[:at]
            return True
        ready = text[: len(text) - self.hold] if self.hold else text
        if not ready.endswith("\ufffd") and len(ready) > len(self.shown):
            self.on_event(Text(ready[len(self.shown) :]))
            self.shown = ready
        return False

    def finish(self, result: Generated) -> None:
        if result.stop_string is None:
            result.text = self.tokenizer.decode(result.ids)
        if len(result.text) > len(self.shown):
            self.on_event(Text(result.text[len(self.shown) :]))


def conversation(prompt: str, system: str | None) -> list[dict[str, str]]:
    """A one-turn conversation: the system prompt (if any) and the user's ``prompt``."""
    system_turn = [{"role": "system", "content": system}] if system is not None else []
    return [*system_turn, {"role": "user", "content": prompt}]


def chat_template_for(source: Path | None, settings: GenerateSettings) -> ChatTemplate:
    """The chat template beside the tokenizer in use: ``generate.tokenizer``'s folder, else the
    source's (``ChatTemplateError`` when it has none)."""
    if settings.tokenizer is not None:
        return load_chat_template(Path(settings.tokenizer).expanduser().parent)
    if source is None:
        raise ArgumentError(
            "generate.chat needs a model with a chat template: set generate.source (or SOURCE)"
        )
    return load_chat_template(model_folder(source))


SAMPLING = ("temperature", "top_k", "top_p", "max_new_tokens")
"""The ``generate`` settings a model's ``generation_config.json`` may choose (and ``do_sample``)."""


def generation_defaults(
    source: Path | None, settings: GenerateSettings, given: Sequence[str] = ()
) -> tuple[GenerateSettings, list[str]]:
    """``settings`` with the sampling choices of the ``generation_config.json`` beside ``source`` for
    every one not in ``given`` (the ones the user set), as transformers reads it: without ``do_sample:
    true`` greedy; with it its ``temperature``, ``top_k`` and ``top_p``; its ``max_new_tokens`` (a value
    ``generate`` would refuse is ignored). Also the names of the settings taken, for the user."""
    data = companion_json(model_folder(source), GENERATION_CONFIG) if source is not None else None
    if data is None:
        return settings, []
    chosen: dict[str, object] = {}
    if data.get("do_sample") is not True:
        if "temperature" not in given:
            chosen["temperature"] = 0.0
    else:
        for name in SAMPLING:
            if name not in given and name in data and _usable(name, data[name]):
                chosen[name] = data[name]
    if "max_new_tokens" not in given and _usable("max_new_tokens", data.get("max_new_tokens")):
        chosen["max_new_tokens"] = data["max_new_tokens"]
    return dataclasses.replace(settings, **chosen), sorted(chosen)  # type: ignore[arg-type]


def _usable(name: str, value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if name in ("top_k", "max_new_tokens"):
        return isinstance(value, int) and value >= 1
    if name == "top_p":
        return 0 < value <= 1
    return math.isfinite(value) and value >= 0


def stop_ids_of(source: Path | None, tokenizer: Tokenizer, settings: GenerateSettings) -> frozenset[int]:
    """The ids generation stops at (``stop_at_eot``): the tokenizer's end-of-text token and every
    ``eos_token_id`` of the model's ``generation_config.json`` (else ``hf_config.json``) beside
    ``source``, as ``transformers`` stops at them."""
    if not settings.stop_at_eot:
        return frozenset()
    ids = {tokenizer.eot_id} if tokenizer.eot_id >= 0 else set()
    if source is not None:
        folder = model_folder(source)
        for name in (GENERATION_CONFIG, SOURCE_CONFIG):
            data = companion_json(folder, name)
            if data is None:
                continue
            eos = data.get("eos_token_id")
            found = eos if isinstance(eos, list) else [eos]
            ids |= {i for i in found if isinstance(i, int) and not isinstance(i, bool) and i >= 0}
            break
    return frozenset(ids)


def tokenizer_for(source: Path | None, settings: GenerateSettings, eot: str = "<|endoftext|>") -> Tokenizer:
    """``settings.tokenizer``, else the ``tokenizer.json`` beside ``source`` (a run or pretrained
    directory, or a checkpoint's run; read inside that folder), else byte-level; in every case the one
    the model was trained with, where it recorded it (``check_tokenizer``: a foreign ``tokenizer.json``
    beside a byte-level model is refused, not used)."""
    tokenizer: Tokenizer
    if settings.tokenizer is not None:
        path = Path(settings.tokenizer).expanduser()
        tokenizer = model_tokenizer(path, eot)
    elif source is not None:
        folder = model_folder(source)
        beside = folder / "tokenizer.json"
        if beside.exists() or beside.is_symlink():
            tokenizer = model_tokenizer(beside, eot, within=folder)
        else:
            tokenizer = ByteTokenizer()
    else:
        tokenizer = ByteTokenizer()
    if source is not None:
        check_tokenizer(source, tokenizer, "generate.source")
    return tokenizer


def model_folder(source: Path) -> Path:
    """The folder of a source's files (tokenizer, chat template, generation config): the run or
    pretrained directory itself, or a checkpoint's run."""
    return source if source.is_dir() else source.parent


def read_prompt(settings: GenerateSettings) -> str:
    if settings.prompt is not None and settings.prompt_file is not None:
        raise ArgumentError("give generate.prompt or generate.prompt_file, not both")
    if settings.prompt_file is not None:
        path = Path(settings.prompt_file).expanduser()
        try:
            return read_text(path, limit=LIMITS["prompt"])
        except InputFileError as exc:
            raise DataError(f"cannot read generate.prompt_file: {exc}") from None
    return settings.prompt or ""


def load_source(source: str, target: Target | str) -> AssembledModel:
    """The model in ``source`` on ``target``: a pretrained directory, a run directory or a checkpoint."""
    from te_assembly.formats.pretrained import WEIGHTS_FILE, from_checkpoint, from_pretrained

    path = Path(source).expanduser()
    recover(path)  # an overwrite interrupted between its two renames: put back, and said
    if path.is_dir() and (path / WEIGHTS_FILE).is_file():
        return from_pretrained(path, target)
    if path.exists():
        return from_checkpoint(path, target)
    raise CheckpointError(
        f"generate.source={source}: no such run directory, checkpoint or pretrained directory"
    )


__all__ = [
    "Generated",
    "Text",
    "chat",
    "chat_template_for",
    "conversation",
    "generate",
    "generate_many",
    "generation_defaults",
    "load_source",
    "model_folder",
    "next_token",
    "read_prompt",
    "stop_ids_of",
    "tokenizer_for",
]
