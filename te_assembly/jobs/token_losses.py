"""Each token's cross-entropy (and squared log-sum-exp, for the z-loss) over one chunk of logits, lean in
memory: what the head's chunks reduce their logits to (``objective.next_token_reduction``).

``torch.nn.functional.cross_entropy`` keeps its log-softmax for backward and builds its gradient from a
one-hot beside it: three tensors of the chunk's logits at once. Here forward keeps the logits alone (they
exist anyway) and one number per token; backward writes ``softmax * weight`` into one new tensor and
takes the label's share off in place: the logits and one tensor their size, never more.
"""

from __future__ import annotations

from typing import Any

import torch

from te_assembly.engines.base import loss_precision


class _TokenLosses(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, logits: torch.Tensor, labels: torch.Tensor, ignore_index: int, with_lse: bool
    ) -> torch.Tensor:
        wide = loss_precision(logits)
        kept = labels != ignore_index
        safe = labels.masked_fill(~kept, 0)
        lse = torch.logsumexp(wide, dim=-1)
        weight = kept.to(lse.dtype)
        columns = [(lse - wide.gather(-1, safe[:, None])[:, 0]) * weight]
        if with_lse:
            columns.append(lse.square() * weight)
        ctx.save_for_backward(logits, safe, lse, weight)
        ctx.with_lse = with_lse
        return torch.stack(columns, dim=-1)

    @staticmethod
    def backward(ctx: Any, upstream: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        logits, safe, lse, weight = ctx.saved_tensors
        label_share = upstream[:, 0].to(lse.dtype) * weight
        softmax_share = label_share
        if ctx.with_lse:  # d lse^2 = 2 lse softmax
            softmax_share = label_share + 2 * lse * upstream[:, 1].to(lse.dtype) * weight
        grad = torch.sub(loss_precision(logits), lse[:, None]).exp_().mul_(softmax_share[:, None])
        grad.scatter_add_(-1, safe[:, None], -label_share[:, None])
        return grad.to(logits.dtype), None, None, None


def token_losses(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int, with_lse: bool = False
) -> torch.Tensor:
    """``[n, 1]`` (``[n, 2]`` ``with_lse``): each token's cross-entropy of ``logits`` ``[n, vocab]``
    against ``labels`` ``[n]`` and its squared log-sum-exp, both 0 where the label is ``ignore_index``;
    in float32 at least."""
    return _TokenLosses.apply(logits, labels, ignore_index, with_lse)  # type: ignore[no-any-return]


__all__ = ["token_losses"]
