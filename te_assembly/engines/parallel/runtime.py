"""``run``, ``train`` and ``bench`` under torchrun: check the launch, start the process groups, always tear
them down, and turn a failed collective into a one-line error.

A rank that raises exits non-zero with its message; torchrun then stops the other ranks. A rank whose
peer died or hangs fails its next collective (gloo notices a closed connection at once; anything else
waits at most ``parallel.timeout_s``) instead of waiting forever.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist

from te_assembly.analysis.parallel.checks import launch_diagnostics, tokens_diagnostics
from te_assembly.analysis.parallel.launch import current_launch
from te_assembly.analysis.parallel.layout import ShardPlan, shard_plan
from te_assembly.analysis.parallel.settings import ParallelSettings
from te_assembly.analysis.plan import Plan
from te_assembly.engines.parallel.context import ParallelContext
from te_assembly.engines.parallel.mesh import build_mesh, init_default_group
from te_assembly.errors import CollectiveError, ConfigError

_COMM_FAILURES = (
    "timed out",
    "connection closed",
    "connection reset",
    "broken pipe",
    "nccl",
    "gloo",
    "socket",
)


def _is_comm_failure(exc: BaseException) -> bool:
    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    return isinstance(exc, RuntimeError) and any(w in str(exc).lower() for w in _COMM_FAILURES)


@contextlib.contextmanager
def parallel_run(
    plan: Plan,
    parallel: ParallelSettings | Mapping[str, Any],
    device: torch.device,
    *,
    command: str,
    tokens: tuple[str, int] | None = None,
    layout: ShardPlan | None = None,
    seq_len: int | None = None,
) -> Iterator[ParallelContext]:
    """The context for this process: single-process (nothing started) unless the ``parallel`` sizes ask
    for more. ``parallel``: the section (checked settings, or the raw mapping). ``tokens``: (config key,
    rows per batch) that must split evenly between the ranks (whole sequences of ``seq_len`` rows when
    given). ``layout``: ``plan``'s layout under these settings when already known (``Analysis.layout``)."""
    settings = parallel if isinstance(parallel, ParallelSettings) else ParallelSettings.from_mapping(parallel)
    launch = current_launch()
    diags = launch_diagnostics(settings, launch, command)
    if tokens is not None:
        diags.extend(tokens_diagnostics(settings, tokens[1], tokens[0], seq_len))
    if diags:
        raise ConfigError(diags)
    if not settings.is_parallel:
        yield ParallelContext.single(plan, settings)
        return
    if layout is None or layout.settings != settings:
        layout, layout_diags = shard_plan(plan, settings)
        if layout is None:
            raise ConfigError(layout_diags)
    started = False
    try:
        device = init_default_group(settings, device, launch.local_rank)
        started = True
        yield ParallelContext(plan, layout, build_mesh(settings, device))
    except RuntimeError as exc:
        if not _is_comm_failure(exc):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CollectiveError(
            f"a collective failed on rank {launch.rank}: {first} (another rank stopped, see its message, or "
            f"waited longer than parallel.timeout_s={settings.timeout_s:g})"
        ) from None
    finally:
        if started and dist.is_initialized():
            dist.destroy_process_group()


__all__ = ["CollectiveError", "parallel_run"]
