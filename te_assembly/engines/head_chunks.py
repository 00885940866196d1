"""A language model's logits reduced chunk by chunk, never held whole (``analysis/head.py``).

A loss asks for a few numbers per token (its cross-entropy, the log-probability of its label), not for
the logits: ``with reduced_logits(model, TokenReduction(reduce, labels, tokens)):`` makes the model's main
output ``y`` those numbers, ``[..., k]``. The model runs up to its head; then, for each chunk of
``tokens`` tokens, the head and ``reduce`` run on that chunk alone and only ``reduce``'s result is kept,
so at most one chunk of logits (and of their float32 copies) exists at once, whatever the vocabulary.
Backward gets each chunk's gradient one of two ways:

- ``summed``: the caller only ever adds up each column of ``y`` (a mean cross-entropy, a z-loss), so
  the gradient of every row of a column is one number times that row's own gradient of the column's
  sum. Forward takes those per chunk right away (the head's backward, while its logits exist) and keeps
  them, the size of the head's input and parameters; backward scales and returns them. Nothing is
  recomputed: the head's work is what it is with the logits whole (Liger's fused linear cross-entropy,
  for any head the plan ends in).
- otherwise (DPO weighs each row's log-probabilities by its pair): each chunk is run again in backward
  (``checkpointed``), one at a time, at the price of the head's forward run twice.

A model without a head that can run per token (``Plan.head`` None, or a head split across
tensor-parallel ranks) computes its logits whole and reduces them chunk by chunk: the logits are held,
their float32 copies are not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from te_assembly.analysis.head import CHUNK_TOKENS
from te_assembly.engines.call_checks import CallError
from te_assembly.engines.recompute import checkpointed

Reduce = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``(logits [n, vocab], labels [n]) -> [n, k]``: what a loss keeps of each token's logits."""
Head = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class TokenReduction:
    """What a caller asks of a language model's logits instead of the logits (module docstring)."""

    reduce: Reduce
    labels: torch.Tensor
    """One per token, shaped as the model's token ids (``[batch, seq]``)."""
    tokens: int
    """Tokens per chunk."""
    summed: bool = False
    """The caller only adds up each column of the result (module docstring): the gradient is taken in
    forward, nothing is recomputed."""


def reduced_in_chunks(
    hidden: torch.Tensor,
    head: Head,
    asked: TokenReduction,
    modules: Sequence[torch.nn.Module] = (),
) -> torch.Tensor:
    """``asked.reduce(head(rows), labels)`` over chunks of ``asked.tokens`` rows of ``hidden``
    ``[..., features]``; ``[..., k]``. ``modules``: those ``head`` runs, whose parameters a ``summed``
    reduction hands their gradients to."""
    lead = hidden.shape[:-1]
    rows = hidden.reshape(-1, hidden.shape[-1])
    labels = asked.labels.reshape(-1)
    if labels.numel() != rows.shape[0]:
        raise CallError(
            f"the loss's labels hold {labels.numel()} tokens ({tuple(asked.labels.shape)}), the model's "
            f"output {rows.shape[0]} ({tuple(lead)})"
        )
    params = list(dict.fromkeys(p for m in modules for p in m.parameters() if p.requires_grad))
    if asked.summed and torch.is_grad_enabled() and (rows.requires_grad or params):
        out = _GradientsAhead.apply(rows, labels, head, asked, *params)
    else:
        pieces = [
            checkpointed(_reduce_chunk, head, asked.reduce, rows[start : start + asked.tokens], part)
            for start, part in zip(
                range(0, rows.shape[0], asked.tokens), labels.split(asked.tokens), strict=True
            )
        ]
        out = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
    return out.reshape(*lead, out.shape[-1])


def _reduce_chunk(head: Head, reduce: Reduce, rows: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return reduce(head(rows), labels)


class _GradientsAhead(torch.autograd.Function):
    """A ``summed`` reduction: each column's gradient taken in forward, chunk by chunk (module
    docstring); backward checks that the caller did only add up each column."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        rows: torch.Tensor,
        labels: torch.Tensor,
        head: Head,
        asked: TokenReduction,
        *params: torch.Tensor,
    ) -> torch.Tensor:
        has_rows = rows.requires_grad
        pieces: list[torch.Tensor] = []
        row_grads: list[list[torch.Tensor]] = []
        """Per column: the rows' gradient of its sum, chunk after chunk."""
        param_grads: list[list[torch.Tensor | None]] = []
        """Per column: each parameter's gradient of its sum, over every chunk."""
        for start in range(0, rows.shape[0], asked.tokens):
            part = labels[start : start + asked.tokens]
            column, columns = 0, 1
            while column < columns:
                # One backward per column, each of a fresh forward: TE's fusers free what they saved
                # at their first backward (no retain_graph), and most losses ask for one column.
                with torch.enable_grad():
                    chunk = rows[start : start + asked.tokens].detach().requires_grad_(has_rows)
                    out = asked.reduce(head(chunk), part)
                    inputs = ([chunk] if has_rows else []) + list(params)
                    found = list(torch.autograd.grad(out[:, column].sum(), inputs, allow_unused=True))
                if column == 0:
                    pieces.append(out.detach())
                    columns = out.shape[-1]
                if len(param_grads) <= column:
                    row_grads.append([])
                    param_grads.append([None] * len(params))
                if has_rows:
                    row = found.pop(0)
                    row_grads[column].append(row if row is not None else torch.zeros_like(chunk))
                _accumulate(param_grads[column], found)
                column += 1
        ctx.row_grads, ctx.param_grads = row_grads, param_grads
        return torch.cat(pieces) if len(pieces) > 1 else pieces[0]

    @staticmethod
    def backward(ctx: Any, upstream: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        weights = upstream[0]
        if not torch.equal(upstream, weights.expand_as(upstream)):
            raise RuntimeError(
                "a summed TokenReduction's result was not only added up column by column: its gradient "
                "differs between rows; ask without summed=True"
            )
        rows_grad: torch.Tensor | None = None
        params: list[torch.Tensor | None] = [None] * len(ctx.param_grads[0]) if ctx.param_grads else []
        for column, (chunks, grads) in enumerate(zip(ctx.row_grads, ctx.param_grads, strict=True)):
            if chunks:
                scaled = torch.cat(chunks).mul_(weights[column])
                rows_grad = scaled if rows_grad is None else rows_grad.add_(scaled)
            _accumulate(params, [None if g is None else g.mul_(weights[column]) for g in grads])
        ctx.row_grads = ctx.param_grads = None
        return (rows_grad, None, None, None, *params)


def _accumulate(into: list[torch.Tensor | None], found: Sequence[torch.Tensor | None]) -> None:
    # In place: a head's weight is the size of the vocabulary's logits for hundreds of tokens, and
    # ``a + b`` would hold a third copy. Each tensor here is a fresh one autograd returned.
    for i, grad in enumerate(found):
        if grad is not None:
            existing = into[i]
            into[i] = grad if existing is None else existing.add_(grad)


def _whole(logits: torch.Tensor) -> torch.Tensor:
    return logits


def reduce_whole_logits(logits: torch.Tensor, asked: TokenReduction) -> torch.Tensor:
    """``asked`` of logits already computed whole (a model without a head to chunk)."""
    return reduced_in_chunks(logits, _whole, asked)


@contextlib.contextmanager
def reduced_logits(model: torch.nn.Module, asked: TokenReduction | None) -> Iterator[None]:
    """Inside, ``model``'s main output is ``asked.reduce`` of its logits, computed chunk by chunk (module
    docstring; ``model``: an ``AssembledModel``, or one wrapped in ``DistributedDataParallel``); None:
    nothing changes."""
    if asked is None:
        yield
        return
    inner: Any = getattr(model, "module", model)
    with inner.reducing(asked):
        yield


__all__ = [
    "CHUNK_TOKENS",
    "Reduce",
    "TokenReduction",
    "reduce_whole_logits",
    "reduced_in_chunks",
    "reduced_logits",
]
