"""What the FSDP2 tests run inside their spawned worlds (``_worlds.spawn_world``)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import torch

from te_assembly.analysis.parallel.settings import ParallelSettings
from te_assembly.engines import build
from te_assembly.engines.target import Target
from te_assembly.formats.checkpoint import sharded as sharded_checkpoint
from tests.parallel._worlds import F64, make_context, shipped


def save_then_die(rank: int, out_dir: str) -> None:
    """Two sharded checkpoints; rank 0 is killed (SIGKILL) in the second one after every rank has
    written its file and the manifest is written, just before the directory is renamed into place."""
    plan = shipped("dense_transformer", hidden=32, ffn=64, heads=2)
    ctx = make_context(plan, ParallelSettings(shard=2))
    torch.manual_seed(0)
    model = ctx.wrap(build(plan, Target.of("reference", dtype=F64, parallel=ctx)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(2, 16, plan.in_features, dtype=F64, generator=torch.Generator().manual_seed(rank))
    y, _ = model(x)
    y.square().mean().backward()
    optimizer.step()
    meta: dict[str, Any] = {"plan": plan.name}
    sharded_checkpoint.save(ctx, Path(out_dir), 1, model, optimizer, meta)

    def die(_directory: Path) -> None:
        if rank == 0:
            os.kill(os.getpid(), signal.SIGKILL)

    sharded_checkpoint.write.fsync_dir = die  # type: ignore[assignment]
    sharded_checkpoint.save(ctx, Path(out_dir), 2, model, optimizer, meta)
