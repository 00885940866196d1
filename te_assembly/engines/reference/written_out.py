"""Attention written out as its textbook formula, for what SDPA has no argument for: attention sinks
(GPT-OSS: a learned logit per head that the softmax sees beside the keys' and that is dropped after, so
a query may attend to nothing much) and soft-capped logits (Gemma 2: ``cap * tanh(logits / cap)``
before the mask). The whole-sequence forward and the key/value cache both call it."""

from __future__ import annotations

import torch


def attend_written_out(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax attention of ``q`` ``[b, h, s, d]`` over ``k`` and ``v`` ``[b, g, t, d]`` (query head i
    reads key/value head i // (h / g)); ``mask`` ``[..., s, t]`` true where a query sees a key (None:
    every key); the logits times ``scale`` (None: ``d ** -0.5``), soft-capped by ``softcap``; with
    ``sinks``, one learned logit per head beside the keys', dropped after the softmax (each row's
    weights then sum to less than one). transformers' eager formula, the largest logit subtracted
    before the softmax."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is None:
        return torch.matmul(torch.softmax(scores, dim=-1), v)
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


__all__ = ["attend_written_out", "causal_mask"]
