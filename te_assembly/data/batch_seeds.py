"""Each training batch's generator seed, a pure function of (seed, step, micro-batch): a resumed run
draws exactly the batches an uninterrupted one would, for the teacher task and for text alike."""

from __future__ import annotations


def step_seed(seed: int, step: int, micro: int = 0) -> int:
    """A distinct, platform-independent generator seed per (seed, step) and, for gradient accumulation,
    per micro-batch; micro-batch 0 is the one a run without accumulation draws."""
    index = step if micro == 0 else -(step * 1_000_003 + micro)
    return (seed * 0x9E3779B97F4A7C15 + index * 0xBF58476D1CE4E5B9) % (2**63)


__all__ = ["step_seed"]
