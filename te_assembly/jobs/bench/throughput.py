"""``bench`` under torchrun: every rank's step time, tokens/s and communication share, and the job's.

Each rank times its own steps (the same interleaved repeats as a single process); rank 0 gathers the
medians. A step ends when its slowest rank's does, so the job's tokens/s is the whole batch over the
slowest rank's median step. The communication share is the time spent inside collectives (tensor- and
expert-parallel exchanges, timed per call, and DDP's gradient all-reduce, timed from launch to
completion) over the step time; DDP overlaps its all-reduce with the rest of backward, so that part can
overlap computation rather than add to it.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from te_assembly.engines.parallel.context import ParallelContext
from te_assembly.jobs.bench.runner import VariantResult


def gather_rank_results(
    par: ParallelContext, result: VariantResult, local_tokens: int
) -> list[dict[str, Any]] | None:
    """Every rank calls this; rank 0 gets one row per rank, the others None."""
    mesh = par.mesh
    assert mesh is not None
    mine = {
        "rank": mesh.rank,
        "coords": (mesh.data_rank, mesh.expert_rank, mesh.tensor_rank),
        "tokens": local_tokens,
        "step": result.stats["step"].median,
        "comm": result.comm_share.get("step", 0.0),
        "phases": {phase: s.median for phase, s in result.stats.items()},
        "phase_comm": dict(result.comm_share),
    }
    gathered: list[Any] = [None] * mesh.world_size if mesh.is_main else []
    dist.gather_object(mine, gathered if mesh.is_main else None, dst=0)
    return [dict(r) for r in gathered] if mesh.is_main else None


def aggregate(rows: list[dict[str, Any]], global_tokens: int) -> dict[str, float]:
    """The job's numbers, for ``bench.report``: tokens/s over the slowest rank, mean communication share."""
    slowest = max(r["step"] for r in rows)
    return {
        "step_s": slowest,
        "tokens_per_s": global_tokens / slowest,
        "comm_share": sum(r["comm"] for r in rows) / len(rows),
    }


__all__ = ["aggregate", "gather_rank_results"]
