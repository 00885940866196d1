"""Each training batch's generator seed, a pure function of (seed, step, micro-batch): a resumed run
draws exactly the batches an uninterrupted one would, for the teacher task and for text alike."""

from __future__ import annotations

import torch


def epoch_units(seed: int, units: int, first: int, count: int) -> list[int]:
    """Rows ``first .. first + count - 1`` of a walk through ``units`` items, pass after pass, each pass
    a permutation seeded by (``seed``, pass): every item once per pass, and each row a pure function of
    the seed and its place (a resumed run gets the very rows)."""
    out: list[int] = []
    row = first
    while len(out) < count:
        epoch, at = divmod(row, units)
        order = torch.randperm(units, generator=torch.Generator().manual_seed(step_seed(seed, 0, epoch)))
        take = min(units - at, count - len(out))
        out.extend(order[at : at + take].tolist())
        row += take
    return out


def step_seed(seed: int, step: int, micro: int = 0) -> int:
    """A distinct, platform-independent generator seed per (seed, step) and, for gradient accumulation,
    per micro-batch; micro-batch 0 is the one a run without accumulation draws."""
    index = step if micro == 0 else -(step * 1_000_003 + micro)
    return (seed * 0x9E3779B97F4A7C15 + index * 0xBF58476D1CE4E5B9) % (2**63)


__all__ = ["epoch_units", "step_seed"]
