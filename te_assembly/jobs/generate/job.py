"""``generate``: a language model continues a prompt, one token at a time.

Each new token comes from the model's logits at the last position of the whole sequence so far (the
last ``context`` tokens of it): no cache of keys and values, the sequence is recomputed each step, which
at these sizes costs little and is exactly the model's own forward. Greedy (``temperature=0``) takes the
argmax; otherwise the logits are divided by the temperature, cut to the ``top_k`` most likely ids and
the smallest set holding ``top_p`` of the probability, and sampled from a generator seeded by ``seed``:
the same seed gives the same text. Generation stops at ``max_new_tokens`` or the end-of-text token.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from te_assembly.data.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer_file
from te_assembly.engines.base import AssembledModel
from te_assembly.engines.target import Target, as_target
from te_assembly.errors import ArgumentError, CheckpointError, DataError
from te_assembly.files.directory import recover
from te_assembly.files.read import LIMITS, InputFileError, read_text
from te_assembly.formats.pretrained import check_tokenizer
from te_assembly.jobs.events import OnEvent, ignore
from te_assembly.jobs.generate.settings import GenerateSettings


@dataclass
class Generated:
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    """The new tokens (the end-of-text token, if it stopped there, not included)."""
    text: str = ""
    stopped_at_eot: bool = False


def next_token(logits: torch.Tensor, settings: GenerateSettings, generator: torch.Generator) -> int:
    """One id from the last position's ``logits`` ``[vocab]`` (module docstring)."""
    logits = logits.double()
    if settings.temperature == 0:
        return int(logits.argmax())
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
    on_event: OnEvent = ignore,
) -> Generated:
    """Continue ``settings.prompt`` (or ``prompt_file``) with ``model`` (module docstring; ``settings``:
    ``GenerateSettings()`` when None). ``model``: a built model, or a run directory, checkpoint or
    pretrained directory loaded on ``target`` (``load_source``); ``target.seed`` seeds the sampling
    unless ``settings.seed`` does. ``tokenizer``: a tokenizer, a ``tokenizer.json``, or a run or
    pretrained directory (its ``tokenizer.json``, else byte-level); None: ``settings.tokenizer``, else the
    one beside a loaded source, else byte-level. ``on_event`` gets a ``Text`` event per new piece."""
    settings = settings if settings is not None else GenerateSettings()
    target = as_target(target)
    source: Path | None = None
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
    seed = settings.seed if settings.seed is not None else target.seed
    return _continue(model, tokenizer, read_prompt(settings), settings, seed, on_event)


def _continue(
    model: AssembledModel,
    tokenizer: Tokenizer,
    prompt: str,
    settings: GenerateSettings,
    seed: int,
    on_event: OnEvent,
) -> Generated:
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    ids = tokenizer.encode(prompt)
    result = Generated(list(ids))
    if not ids:
        ids = [tokenizer.eot_id] if tokenizer.eot_id >= 0 else [0]  # an empty prompt: start a document
    generator = torch.Generator().manual_seed(seed)
    shown = ""
    model.eval()
    with torch.no_grad():
        for _ in range(settings.max_new_tokens):
            window = torch.tensor([ids[-settings.context :]], dtype=torch.int64, device=device)
            y, _ = model(window)
            token = next_token(y[0, -1], settings, generator)
            if settings.stop_at_eot and token == tokenizer.eot_id:
                result.stopped_at_eot = True
                break
            ids.append(token)
            result.ids.append(token)
            text = tokenizer.decode(result.ids)
            # A byte-level id can end inside a UTF-8 character: show it once it is whole.
            if not text.endswith("\ufffd") and len(text) > len(shown):
                on_event(Text(text[len(shown) :]))
                shown = text
    result.text = tokenizer.decode(result.ids)
    if len(result.text) > len(shown):
        on_event(Text(result.text[len(shown) :]))
    return result


def tokenizer_for(source: Path | None, settings: GenerateSettings, eot: str = "<|endoftext|>") -> Tokenizer:
    """``settings.tokenizer``, else the ``tokenizer.json`` beside ``source`` (a run or pretrained
    directory, or a checkpoint's run; read inside that folder), else byte-level; in every case the one
    the model was trained with, where it recorded it (``check_tokenizer``: a foreign ``tokenizer.json``
    beside a byte-level model is refused, not used)."""
    tokenizer: Tokenizer
    if settings.tokenizer is not None:
        tokenizer = load_tokenizer_file(Path(settings.tokenizer).expanduser(), eot)
    elif source is not None:
        folder = source if source.is_dir() else source.parent
        beside = folder / "tokenizer.json"
        found = beside.exists() or beside.is_symlink()
        tokenizer = load_tokenizer_file(beside, eot, within=folder) if found else ByteTokenizer()
    else:
        tokenizer = ByteTokenizer()
    if source is not None:
        check_tokenizer(source, tokenizer, "generate.source")
    return tokenizer


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
    "generate",
    "load_source",
    "next_token",
    "read_prompt",
    "tokenizer_for",
]
