"""``eval``: a language model scored on a text, without training it.

The text's token ids are cut into windows of ``seq_len`` positions, ``stride`` apart (Hugging Face's
sliding-window perplexity): each window predicts its next tokens, and only the targets no earlier
window scored count, so every token after the first is scored exactly once, with ``seq_len - stride``
tokens of context at least (once the first window is behind). ``stride = seq_len`` puts the windows
side by side (the fastest; each window starts without context). Reported: the mean next-token
cross-entropy (nats), its perplexity, and bits per UTF-8 byte (comparable across tokenizers; not for
pre-tokenized data, whose bytes are unknown).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from te_assembly.data.cache import prepare
from te_assembly.data.corpus import bits_per_byte, bytes_per_token
from te_assembly.data.settings import DataSettings
from te_assembly.engines.base import AssembledModel, loss_precision
from te_assembly.engines.head_chunks import CHUNK_TOKENS, reduced_logits
from te_assembly.engines.target import Target, as_target
from te_assembly.errors import ArgumentError, DataError
from te_assembly.jobs.eval.settings import EvalSettings
from te_assembly.jobs.events import Advanced, OnEvent, ignore
from te_assembly.jobs.objective import next_token_reduction
from te_assembly.jobs.window import DEFAULT, check_model_window_fits, window

IGNORE = -100
FIT_KEYS = "eval.seq_len or eval.batch"
"""What to lower when a batch of windows would not fit."""


@dataclass(frozen=True)
class Evaluated:
    """What ``eval`` found (``eval.json``)."""

    loss: float
    """Mean next-token cross-entropy over the scored tokens, in nats."""
    perplexity: float
    bits_per_byte: float | None
    tokens: int
    """Targets scored."""
    windows: int
    seq_len: int
    stride: int

    def as_json(self) -> dict[str, float | int | None]:
        return dict(self.__dict__)


def windows(length: int, seq_len: int, stride: int) -> list[tuple[int, int, int]]:
    """``(begin, end, skip)`` of each window over ``length`` ids: inputs ``ids[begin:end]``, targets
    ``ids[begin + 1:end + 1]``, the first ``skip`` targets already scored by an earlier window."""
    if stride > seq_len:
        raise ArgumentError(
            f"eval.stride={stride} is more than eval.seq_len={seq_len}: tokens would be skipped"
        )
    out: list[tuple[int, int, int]] = []
    scored, begin, last = 0, 0, length - 1
    while scored < last:
        end = min(begin + seq_len, last)
        out.append((begin, end, max(scored - begin, 0)))
        scored = end
        begin += stride
    return out


def score(
    model: AssembledModel,
    ids: Sequence[int] | np.ndarray | torch.Tensor,
    seq_len: int,
    stride: int | None = None,
    batch: int = 8,
    on_event: OnEvent = ignore,
    chunk_tokens: int | None = CHUNK_TOKENS,
) -> tuple[float, int, int]:
    """``(summed cross-entropy in nats, targets scored, windows)`` of ``model`` on the token ``ids``
    (module docstring). The model runs in eval mode without gradients; the loss is summed in float64
    from float32-at-least cross-entropies."""
    flat = torch.as_tensor(np.asarray(ids, dtype=np.int64)).reshape(-1)
    if flat.numel() < 2:
        raise DataError(f"eval needs at least 2 tokens to score one; the text has {flat.numel()}")
    cut = windows(flat.numel(), seq_len, stride or seq_len)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    groups: dict[int, list[tuple[int, int, int]]] = {}
    for w in cut:
        groups.setdefault(w[1] - w[0], []).append(w)
    total, count, done = 0.0, 0, 0
    model.eval()
    with torch.no_grad():
        for chunk in (g[i : i + batch] for g in groups.values() for i in range(0, len(g), batch)):
            x = torch.stack([flat[b:e] for b, e, _ in chunk]).to(device)
            labels = torch.stack([flat[b + 1 : e + 1] for b, e, _ in chunk]).to(device)
            for row, (_, _, skip) in enumerate(chunk):
                labels[row, :skip] = IGNORE
            summed, labelled = _summed_loss(model, x, labels, chunk_tokens)
            total, count, done = total + summed, count + labelled, done + len(chunk)
            on_event(Advanced("eval", done, len(cut), f"{count:,} tokens"))
    return total, count, len(cut)


def _summed_loss(
    model: AssembledModel, x: torch.Tensor, labels: torch.Tensor, chunk_tokens: int | None
) -> tuple[float, int]:
    """The next-token cross-entropy of ``model`` on ``x`` summed over the labels that are not
    ``IGNORE`` (float32 at least, the sum in float64), and how many they are; the logits computed
    ``chunk_tokens`` at a time (``engines/head_chunks.py``; None: whole)."""
    if chunk_tokens is not None:
        with reduced_logits(model, next_token_reduction(labels, chunk_tokens, ignore_index=IGNORE)):
            per_token = model(x).y
        summed = per_token.double().sum()
    else:
        logits = loss_precision(model(x).y)
        summed = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE, reduction="sum"
        )
    return float(summed.double()), int((labels != IGNORE).sum())


def evaluate(
    model: AssembledModel | str | os.PathLike[str],
    target: Target | str,
    data: DataSettings | None = None,
    settings: EvalSettings | None = None,
    *,
    on_event: OnEvent = ignore,
) -> Evaluated:
    """Score ``model`` (a built model, or a run directory, checkpoint or pretrained directory loaded
    on ``target``) on ``data`` (default: the default corpus), tokenized with the model's own tokenizer
    (its ``tokenizer.json``, else byte-level; ``data.tokenizer.path`` must be that one)."""
    from te_assembly.jobs.generate.job import load_source

    settings = settings if settings is not None else EvalSettings()
    data = data if data is not None else DataSettings()
    source: Path | None = None
    if not isinstance(model, AssembledModel):
        source = Path(model).expanduser()
        model = load_source(str(model), as_target(target))
    plan = model.plan
    if not plan.takes_token_ids or plan.out_features != plan.in_features:
        raise ArgumentError(
            f"{plan.name} is not a language model (token ids in, logits over its vocabulary out)"
        )
    seq_len = window(settings.seq_len, source, "eval.seq_len", plan.name, at_most=DEFAULT)
    settings = dataclasses.replace(settings, seq_len=seq_len)
    data = _with_model_tokenizer(data, source)
    if settings.split == "all":  # every document in its own order, none held out
        data = dataclasses.replace(data, val_fraction=0.0)
    if data.format == "chat":
        return _evaluate_answers(model, data, settings, on_event)
    corpus = prepare(data)
    if corpus.tokenizer.vocab_size > plan.in_features:
        raise DataError(
            f"the tokenizer has {corpus.tokenizer.vocab_size} ids, {plan.name}'s vocabulary "
            f"{plan.in_features}: it is not the one the model was trained with"
        )
    split = "val" if settings.split == "val" else "train"  # split=all holds every document in "train"
    ids = corpus.val if split == "val" else corpus.train
    per_token = bytes_per_token(corpus.meta, split)
    if not settings.add_eot and corpus.tokenizer.eot_id >= 0:  # the separators the cache keeps, left out
        kept = np.asarray(ids)
        ids = kept[kept != corpus.tokenizer.eot_id]
        per_token = per_token * len(kept) / len(ids) if per_token is not None and len(ids) else per_token
    check_model_window_fits(model, settings.batch, min(seq_len, max(len(ids) - 1, 1)), FIT_KEYS)
    total, count, made = score(
        model, ids, seq_len, settings.stride, settings.batch, on_event, settings.loss_chunk_tokens
    )
    loss = total / count
    return Evaluated(
        loss=loss,
        perplexity=math.exp(min(loss, 700.0)),
        bits_per_byte=bits_per_byte(loss, per_token),
        tokens=count,
        windows=made,
        seq_len=seq_len,
        stride=settings.stride or seq_len,
    )


def _evaluate_answers(
    model: AssembledModel, data: DataSettings, settings: EvalSettings, on_event: OnEvent
) -> Evaluated:
    """Conversations (``data.format=chat``): the loss on the assistant's tokens, each conversation one
    window of at most ``seq_len`` tokens, as instruction fine-tuning computes it."""
    from te_assembly.data.conversations import ChatCorpus

    assert settings.seq_len is not None  # decided by ``evaluate``
    corpus = ChatCorpus.prepare(data, settings.seq_len)
    check_model_window_fits(model, settings.batch, settings.seq_len, FIT_KEYS)
    examples = corpus.val if settings.split == "val" else corpus.train + corpus.val
    if not examples:
        raise DataError(f"{corpus.meta['sources']} has no conversation with an answer to score")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for start in range(0, len(examples), settings.batch):
            x, labels = corpus.rows(examples[start : start + settings.batch])
            summed, labelled = _summed_loss(
                model, x.to(device), labels.to(device), settings.loss_chunk_tokens
            )
            total, count = total + summed, count + labelled
            on_event(
                Advanced(
                    "eval", min(start + settings.batch, len(examples)), len(examples), f"{count:,} tokens"
                )
            )
    loss = total / count
    return Evaluated(
        loss, math.exp(min(loss, 700.0)), None, count, len(examples), settings.seq_len, settings.seq_len
    )


def _with_model_tokenizer(data: DataSettings, source: Path | None) -> DataSettings:
    """``data`` tokenized with the tokenizer ``source`` was trained with: its ``tokenizer.json`` unless
    ``data.tokenizer`` names one (held to the recorded fingerprint either way)."""
    from te_assembly.data.chat import model_tokenizer
    from te_assembly.formats.tokenizer_record import check_tokenizer
    from te_assembly.jobs.generate.job import tokenizer_for
    from te_assembly.jobs.generate.settings import GenerateSettings

    if source is None:
        return data
    if data.tokenizer.path is not None:
        check_tokenizer(
            source,
            model_tokenizer(Path(data.tokenizer.path).expanduser(), data.tokenizer.eot),
            "data.tokenizer.path",
        )
        return data
    tokenizer = tokenizer_for(source, GenerateSettings(), data.tokenizer.eot)  # the one beside it, checked
    path = getattr(tokenizer, "source", None)
    if path is None:
        return data
    # The end-of-text token it was loaded with (its eos_token where it has no data.tokenizer.eot).
    eot = getattr(tokenizer, "eot", data.tokenizer.eot)
    return dataclasses.replace(data, tokenizer=dataclasses.replace(data.tokenizer, path=str(path), eot=eot))


__all__ = ["Evaluated", "evaluate", "score", "windows"]
