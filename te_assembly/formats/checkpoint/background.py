"""Checkpoints written in the background (``train.async_checkpoint``): DCP's ``async_save`` copies the
model and optimizer state to host memory while the step waits (a copy, not a write), then writes the
sharded checkpoint's files (``sharded.py``'s format) in a thread while training goes on.

A checkpoint counts only once complete: every rank's file written, then rank 0 checksums them, writes the
manifest and renames the hidden temporary directory into place (``sharded.seal``, in a thread of its
own: hashing the files is no wait for the step either), exactly as a synchronous one. Until then nothing
names it, so a run killed during the background write keeps the previous checkpoint as its newest, and
the next run removes the temporary directory. One write is under way at a time: a checkpoint due while
the last is still being written waits for it first.

Under torchrun the background thread's collectives run on a gloo process group of their own, so they
never interleave with the training step's.
"""

from __future__ import annotations

import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from te_assembly.engines.parallel.context import ParallelContext
from te_assembly.errors import CheckpointError, first_line
from te_assembly.formats.checkpoint import sharded

# One process writes alone by intent (``no_dist``); DCP's writer thread says so on every save.
warnings.filterwarnings("ignore", message=".*assuming the intent is to save in a single process.*")


@dataclass
class _Writing:
    future: Future[Any]
    temp: Path
    final: Path
    step: int
    meta: dict[str, Any]
    rng: list[str]
    sealing: Future[Path | None] | None = None
    """Rank 0's checksums, manifest and rename, once every rank has written."""


class BackgroundWriter:
    """Starts each checkpoint's write (``start``) and seals it once every rank has written
    (``poll`` at each step's start, ``finish`` to wait), returning its path on rank 0."""

    def __init__(self, par: ParallelContext) -> None:
        import torch.distributed as dist

        self.par = par
        group = dist.new_group(backend="gloo") if par.is_parallel else None
        self.group = group if isinstance(group, dist.ProcessGroup) else None
        self.writing: _Writing | None = None
        self.sealer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="te_assembly-seal")

    def start(
        self,
        out_dir: Path,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        meta: dict[str, Any],
    ) -> Path | None:
        """Begin writing ``ckpt-<step>.dcp`` (waiting for the previous write first: its path, on rank 0,
        is returned). ``NonFiniteError`` on every rank, nothing started, for a NaN/Inf parameter."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import HuggingFaceStorageWriter

        done = self.finish()
        par = self.par
        flat, temp, rng = sharded.begin_write(par, out_dir, step, model, optimizer)
        writer = HuggingFaceStorageWriter(str(temp), save_distributed=True)
        saved = dcp.async_save(
            flat, storage_writer=writer, process_group=self.group, no_dist=not par.is_parallel
        )
        # a Future, or (with a stager of its own) a response whose upload_completion is one
        future: Future[Any] = saved if isinstance(saved, Future) else saved.upload_completion
        self.writing = _Writing(future, temp, sharded.checkpoint_dir(out_dir, step), step, dict(meta), rng)
        return done

    def poll(self) -> Path | None:
        """The checkpoint being written, once complete: its path on rank 0, None while any rank still
        writes or rank 0 still seals it. Every rank calls it at the same point (under torchrun the ranks
        agree there that all have written; rank 0 then checksums, writes the manifest and renames in a
        thread of its own)."""
        writing = self.writing
        if writing is None:
            return None
        if writing.sealing is None:
            if not self.par.all_agree(writing.future.done()):
                return None
            self._seal(writing)
        assert writing.sealing is not None
        if not writing.sealing.done():
            return None
        return self.finish()

    def finish(self) -> Path | None:
        """Wait for the checkpoint being written and sealed (its path on rank 0, None elsewhere or when
        none is); ``CheckpointError`` on every rank when any rank's write failed (the temporary
        directory removed, earlier checkpoints intact), on rank 0 when sealing failed."""
        writing = self.writing
        if writing is None:
            return None
        if writing.sealing is None:
            self._seal(writing)
        assert writing.sealing is not None
        self.writing = None
        return writing.sealing.result()

    def _seal(self, writing: _Writing) -> None:
        """Every rank's write has ended (waited for): agree it succeeded everywhere, then rank 0 seals the
        directory in the background (the others have nothing more to do)."""
        par, problem = self.par, None
        try:
            writing.future.result()
        except Exception as exc:  # whatever the writer thread raised (a full disk: OSError, RuntimeError)
            problem = first_line(exc)
        try:
            sharded.check_written(par, writing.temp, writing.final, problem)
        except CheckpointError:
            self.writing = None  # a failed write leaves nothing to wait for
            raise
        sealed: Future[Path | None] = Future()
        if par.is_main:
            args = (writing.temp, writing.final, writing.step, writing.meta, par, writing.rng)
            sealed = self.sealer.submit(sharded.seal, *args)
        else:
            sealed.set_result(None)
        writing.sealing = sealed


__all__ = ["BackgroundWriter"]
