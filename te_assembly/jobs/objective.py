"""The objective every job computes, written once: a main term (the teacher regression's error, the mean
square of the output, or a language model's next-token cross-entropy), plus every loss output the model
returns (slots the catalog marks ``is_loss``, e.g. TopKRouter's ``aux_loss``, whatever their channel is
called; added as they are: the op already weights them), in float32 at least (``loss_precision``)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import torch

from te_assembly.engines.base import loss_precision
from te_assembly.engines.head_chunks import TokenReduction
from te_assembly.jobs.token_losses import token_losses

MEAN_SQUARE = "mean(y^2)"
TEACHER_MSE = "mse(y, teacher)"
CROSS_ENTROPY = "cross_entropy"
MTP = "mtp"
"""The multi-token prediction term (``next_token_terms``' ``ahead``)."""
Z_LOSS = "z_loss"
IGNORE_INDEX = -100
"""Labels equal to this (padding) add nothing to the cross-entropy and get no gradient (torch's and TE's
default)."""


def aux_losses(extras: Mapping[str, torch.Tensor], loss_names: Sequence[str]) -> dict[str, torch.Tensor]:
    """The public outputs named in ``loss_names`` (``engines.base.loss_output_names``), each summed."""
    return {
        name: loss_precision(extras[name]).sum() for name in loss_names if extras[name].is_floating_point()
    }


def loss_terms(
    y: torch.Tensor,
    extras: Mapping[str, torch.Tensor],
    loss_names: Sequence[str],
    *,
    target: torch.Tensor | None = None,
    other_outputs: bool = False,
    x: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Named terms of the objective: the main term (``mse(y, target)`` when a target is given; for a
    language model's token ids ``x``, the next-token cross-entropy against ``x`` shifted by one; else the
    mean square of ``y``), then each loss output; ``other_outputs``: also the mean square of every other
    public float output, so gradients come back from the caller for them as they would in training."""
    if x is not None and not x.is_floating_point():
        terms = next_token_terms(y, x.roll(-1, dims=-1), {}, ())
    elif target is not None:
        main = torch.nn.functional.mse_loss(loss_precision(y), loss_precision(target))
        terms = {TEACHER_MSE: main}
    else:
        terms = {MEAN_SQUARE: loss_precision(y).square().mean()}
    for name, value in extras.items():
        if not value.is_floating_point():
            continue
        if name in loss_names:
            terms[name] = loss_precision(value).sum()
        elif other_outputs:
            terms[name] = loss_precision(value).square().mean()
    return terms


def next_token_terms(
    logits: torch.Tensor,
    labels: torch.Tensor,
    extras: Mapping[str, torch.Tensor],
    loss_names: Sequence[str],
    *,
    z_loss: float = 0.0,
    ignore_index: int = IGNORE_INDEX,
    fused: bool = False,
    ahead: Mapping[str, int] | None = None,
    mtp_weight: float = 0.0,
    documents: torch.Tensor | None = None,
    reduced: bool = False,
) -> dict[str, torch.Tensor]:
    """A language model's objective: the mean next-token cross-entropy of ``logits`` ``[..., vocab]``
    against ``labels`` ``[...]`` over the labels that are not ``ignore_index``, in float32 at least;
    with ``z_loss > 0`` also ``z_loss * mean(logsumexp(logits)^2)`` over the same positions (PaLM's
    auxiliary term, which keeps the softmax normaliser near 1); then every loss output (router aux
    losses) as it is. ``fused``: TE's fused cross-entropy kernel (``parallel_cross_entropy``, a Triton
    kernel: CUDA only), which computes in float32 whatever the logits' dtype. ``ahead``: the public
    outputs that are multi-token prediction logits, each with its depth (``engines.base.ahead_outputs``):
    with ``mtp_weight > 0`` the term ``mtp`` is DeepSeek-V3's MTP loss, ``mtp_weight`` times the mean
    over the modules of each one's cross-entropy against the token ``depth`` past the next
    (``ahead_labels``; ``documents``: a packed batch's, so no target is taken across a document's end).
    ``reduced``: ``logits`` are what ``next_token_reduction``'s chunks made of them instead."""
    if reduced:
        terms = _reduced_terms(logits, labels, z_loss, ignore_index)
    else:
        terms = {CROSS_ENTROPY: cross_entropy(logits, labels, ignore_index=ignore_index, fused=fused)}
    if z_loss > 0 and not reduced:
        kept = labels.reshape(-1) != ignore_index
        lse = torch.logsumexp(loss_precision(logits).reshape(-1, logits.shape[-1]), dim=-1)
        terms[Z_LOSS] = z_loss * (lse.square() * kept).sum() / kept.sum().clamp(min=1)
    if ahead and mtp_weight > 0:
        each = [
            cross_entropy(extras[name], ahead_labels(labels, depth, documents, ignore_index), fused=fused)
            for name, depth in ahead.items()
        ]
        terms[MTP] = mtp_weight * torch.stack(each).mean()
    for name, value in extras.items():
        if name in loss_names and value.is_floating_point():
            terms[name] = loss_precision(value).sum()
    return terms


def cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, *, ignore_index: int = IGNORE_INDEX, fused: bool = False
) -> torch.Tensor:
    """The mean cross-entropy of ``logits`` ``[..., vocab]`` against ``labels`` ``[...]`` over the labels
    that are not ``ignore_index``, in float32 at least (``next_token_terms``' ``fused``)."""
    vocab = logits.shape[-1]
    flat_labels = labels.reshape(-1)
    count = (flat_labels != ignore_index).sum().clamp(min=1)
    if fused:
        from transformer_engine.pytorch.cross_entropy import parallel_cross_entropy

        rows = logits.reshape(1, -1, vocab)
        per_token = parallel_cross_entropy(rows, flat_labels.reshape(1, -1), ignore_idx=ignore_index)
        return per_token.reshape(-1).float().sum() / count
    flat = loss_precision(logits).reshape(-1, vocab)
    ce = torch.nn.functional.cross_entropy(flat, flat_labels, ignore_index=ignore_index, reduction="sum")
    return ce / count


def next_token_reduction(
    labels: torch.Tensor,
    tokens: int,
    *,
    z_loss: float = 0.0,
    fused: bool = False,
    ignore_index: int = IGNORE_INDEX,
    summed: bool = True,
) -> TokenReduction:
    """What a language model's loss keeps of its logits when they are computed ``tokens`` at a time
    (``engines/head_chunks.py``): per token, its cross-entropy against ``labels`` (0 where ignored: so
    minus the label's log-probability, what DPO sums) and, with ``z_loss > 0``, its squared log-sum-exp
    (0 where ignored). ``summed``: the caller only adds them up (``next_token_terms``); false for DPO,
    which weighs each row's."""
    reduce = functools.partial(_token_losses, with_lse=z_loss > 0, fused=fused, ignore_index=ignore_index)
    return TokenReduction(reduce, labels, tokens, summed)


def _token_losses(
    logits: torch.Tensor, labels: torch.Tensor, *, with_lse: bool, fused: bool, ignore_index: int
) -> torch.Tensor:
    if fused and not with_lse:
        from transformer_engine.pytorch.cross_entropy import parallel_cross_entropy

        per_token = parallel_cross_entropy(logits[None], labels[None], ignore_idx=ignore_index)
        return per_token.reshape(-1, 1).float()
    return token_losses(logits, labels, ignore_index, with_lse)


def _reduced_terms(
    per_token: torch.Tensor, labels: torch.Tensor, z_loss: float, ignore_index: int
) -> dict[str, torch.Tensor]:
    kept = labels != ignore_index
    count = kept.sum().clamp(min=1)
    terms = {CROSS_ENTROPY: per_token[..., 0].sum() / count}
    if z_loss > 0:
        terms[Z_LOSS] = z_loss * per_token[..., 1].sum() / count
    return terms


def ahead_labels(
    labels: torch.Tensor,
    depth: int,
    documents: torch.Tensor | None = None,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """A multi-token prediction module's targets: at position i the token ``depth`` past the next one,
    ``labels[..., i + depth]`` (``labels`` being the next tokens), ignored where that runs past the row,
    and, for packed rows, where position i and i + ``depth`` lie in different documents. A label the
    batch ignores (a prompt's, padding) stays ignored at its new place."""
    ahead = labels.roll(-depth, dims=-1).clone()
    ahead[..., -depth:] = ignore_index
    if documents is not None:
        ahead[documents != documents.roll(-depth, dims=-1)] = ignore_index
    return ahead


def total(terms: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The objective: the sum of its terms (in the widest of their dtypes)."""
    values = list(terms.values())
    dtype = values[0].dtype
    for value in values[1:]:
        dtype = torch.promote_types(dtype, value.dtype)
    return torch.stack([v.to(dtype) for v in values]).sum()


def objective(
    y: torch.Tensor,
    extras: Mapping[str, torch.Tensor],
    loss_names: Sequence[str],
    *,
    target: torch.Tensor | None = None,
    other_outputs: bool = False,
    x: torch.Tensor | None = None,
) -> torch.Tensor:
    """``total(loss_terms(...))``."""
    return total(loss_terms(y, extras, loss_names, target=target, other_outputs=other_outputs, x=x))


__all__ = [
    "CROSS_ENTROPY",
    "IGNORE_INDEX",
    "MEAN_SQUARE",
    "MTP",
    "TEACHER_MSE",
    "Z_LOSS",
    "ahead_labels",
    "aux_losses",
    "cross_entropy",
    "loss_terms",
    "next_token_reduction",
    "next_token_terms",
    "objective",
    "total",
]
