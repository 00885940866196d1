"""Recomputing activations in backward instead of keeping them: what activation checkpointing and the head's
chunks (``head_chunks.py``) share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def checkpointed(run: Callable[..., Any], *args: Any) -> Any:
    """``run(*args)``, its activations recomputed in backward instead of kept (the RNG state replayed,
    so dropout draws the same mask)."""
    import torch.utils.checkpoint

    if not torch.is_grad_enabled():
        return run(*args)
    return torch.utils.checkpoint.checkpoint(run, *args, use_reentrant=False)


__all__ = ["checkpointed"]
