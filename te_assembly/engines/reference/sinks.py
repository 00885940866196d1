"""Attention sinks (GPT-OSS): a learned logit per head that the softmax sees beside the keys' and that
is dropped after it, so a query may attend to nothing much. SDPA has no such term, so the attention with
sinks is written out here, for the whole-sequence forward and the key/value cache alike."""

from __future__ import annotations

import torch


def attend_with_sinks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, sinks: torch.Tensor
) -> torch.Tensor:
    """Softmax attention whose softmax also sees one learned logit per head (``sinks``, GPT-OSS's
    attention sinks), dropped after: each row's weights sum to less than one. ``q`` ``[b, h, s, d]``,
    ``k`` and ``v`` ``[b, g, t, d]`` (query head i reads key/value head i // (h / g)), ``mask``
    ``[..., s, t]`` true where a query sees a key (None: every key). Written out (SDPA has no sink):
    transformers' eager formula, the largest logit subtracted before the softmax."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * q.shape[-1] ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    sink = sinks.to(scores.dtype).reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    combined = torch.cat((scores, sink), dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    probs = torch.softmax(combined, dim=-1)[..., :-1]
    return torch.matmul(probs, v)


def causal_mask(seq: int, window: int | None, device: torch.device) -> torch.Tensor:
    """``[seq, seq]``: query p sees keys q <= p (and p - q < window with a window)."""
    positions = torch.arange(seq, device=device)
    behind = positions[:, None] - positions[None, :]
    return (behind >= 0) & (behind < window) if window is not None else behind >= 0


__all__ = ["attend_with_sinks", "causal_mask"]
