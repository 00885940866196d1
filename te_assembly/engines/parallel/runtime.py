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
from te_assembly.errors import CollectiveError, ConfigError, ParallelError, first_line
from te_assembly.version import source_sha256

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
    config_sha256: str | None = None,
) -> Iterator[ParallelContext]:
    """The context for this process: single-process (nothing started) unless the ``parallel`` sizes ask
    for more. ``parallel``: the section (checked settings, or the raw mapping). ``tokens``: (config key,
    rows per batch) that must split evenly between the ranks (whole sequences of ``seq_len`` rows when
    given). ``layout``: ``plan``'s layout under these settings when already known (``Analysis.layout``).
    ``config_sha256``: the resolved config's, which every rank must share, as it must te_assembly's code
    (``same_everywhere``)."""
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
        device = _joined(settings, device, launch)
        started = True
        context = ParallelContext(plan, layout, build_mesh(settings, device))
        same_everywhere(config_sha256)
        yield context
    except RuntimeError as exc:
        if not _is_comm_failure(exc):
            raise
        first = first_line(exc)
        raise CollectiveError(
            f"a collective failed on rank {launch.rank}: {first} (another rank stopped, see its message, or "
            f"waited longer than parallel.timeout_s={settings.timeout_s:g})"
        ) from None
    finally:
        if started and dist.is_initialized():
            dist.destroy_process_group()


def _joined(settings: ParallelSettings, device: torch.device, launch: Any) -> torch.device:
    """The default process group, or ``ParallelError`` naming this rank and the rendezvous it could not
    reach (the first node down, a wrong address or port, a firewall) within ``parallel.timeout_s``."""
    import os

    try:
        return init_default_group(settings, device, launch.local_rank)
    except (RuntimeError, ValueError) as exc:
        if not _is_comm_failure(exc):
            raise
        where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
        first = first_line(exc)
        raise ParallelError(
            f"rank {launch.rank} of {launch.world_size} cannot reach the rendezvous at {where} within "
            f"parallel.timeout_s={settings.timeout_s:g} ({first[:200]}): is the first node up, and its "
            "address and port the ones every node was given?"
        ) from None


def same_everywhere(config_sha256: str | None) -> None:
    """``ParallelError`` on every rank when any rank runs other te_assembly code or another resolved
    config than rank 0 (a node left on an older checkout, an override or a file that differs), naming
    the ranks; before any of them builds or trains anything."""
    mine = {"code": source_sha256(), "config": config_sha256}
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    kinds = (
        ("code", "te_assembly code", "install the same te_assembly on every node"),
        ("config", "resolved config", "every node must run the same command on the same config files"),
    )
    for key, what, fix in kinds:
        odd = [rank for rank, found in enumerate(every) if found[key] != every[0][key]]
        if odd:
            ranks = ", ".join(map(str, odd))
            theirs, ours = str(every[odd[0]][key])[:12], str(every[0][key])[:12]
            raise ParallelError(
                f"rank {ranks} of {len(every)} runs another {what} than rank 0 (sha256 {theirs}... against "
                f"{ours}...): {fix}"
            )


__all__ = ["CollectiveError", "parallel_run", "same_everywhere"]
