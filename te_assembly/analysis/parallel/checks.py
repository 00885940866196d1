"""The ``parallel:`` section checked at config time, before any process group exists. Pure Python.

Three kinds of finding, all as diagnostics with their key path: the section's own values; the model's
layout under those sizes (``layout.shard_plan``: divisibility, tensor-parallel regions, expert rules);
and, for the commands that start work, whether this process was launched with that many ranks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from te_assembly.analysis.parallel.launch import Launch, current_launch, torchrun_command
from te_assembly.analysis.parallel.layout import ShardPlan, shard_plan
from te_assembly.analysis.parallel.settings import ParallelSettings
from te_assembly.analysis.plan import Plan
from te_assembly.diagnostics import Diagnostic, error
from te_assembly.errors import ConfigError


def read_settings(raw: Mapping[str, Any] | None) -> tuple[ParallelSettings | None, list[Diagnostic]]:
    try:
        return ParallelSettings.from_mapping(raw or {}), []
    except ConfigError as exc:
        return None, exc.diagnostics


def launch_diagnostics(settings: ParallelSettings, launch: Launch, command: str = "run") -> list[Diagnostic]:
    """This process's world (torchrun's ``WORLD_SIZE``, or 1) must be the layout's."""
    needed = settings.world_size
    if launch.under_torchrun and launch.world_size != needed:
        return [
            error(
                "parallel",
                "parallel-world-size",
                f"torchrun started {launch.world_size} process(es) but the parallel sizes "
                f"({settings.describe()}) "
                f"need {needed}",
                f"launch {torchrun_command(needed, command)}, or change parallel.data / shard / tensor / "
                f"expert so they multiply to {launch.world_size}",
            )
        ]
    if not launch.under_torchrun and needed > 1:
        return [
            error(
                "parallel",
                "parallel-not-launched",
                f"the parallel sizes ({settings.describe()}) need {needed} processes, but this is a single "
                "process (no torchrun environment)",
                f"launch {torchrun_command(needed, command)}",
            )
        ]
    return []


def parallel_diagnostics(
    raw: Mapping[str, Any] | None,
    plan: Plan | None,
    *,
    command: str | None = None,
    launch: Launch | None = None,
) -> tuple[ShardPlan | None, list[Diagnostic]]:
    """Every finding about the ``parallel`` section for ``plan``. ``command``: a command that starts work
    (run, train, bench) also checks this process's launch; ``validate`` and ``explain`` describe a layout
    for any launch, so they only check it when run under torchrun."""
    settings, diags = read_settings(raw)
    if settings is None:
        return None, diags
    launch = current_launch() if launch is None else launch
    if command is not None or launch.under_torchrun:
        diags.extend(launch_diagnostics(settings, launch, command or "run"))
    if plan is None:
        return None, diags
    layout, layout_diags = shard_plan(plan, settings)
    return layout, [*diags, *layout_diags]


def tokens_diagnostics(
    settings: ParallelSettings, tokens: int, key: str, seq_len: int | None = None
) -> list[Diagnostic]:
    """A batch of ``tokens`` rows (at config key ``key``) must cut evenly between the ranks reading rows.
    ``seq_len``: ``x`` is ``[batch, seq, features]`` and ranks read whole sequences of that many rows."""
    shards = settings.row_shards
    unit = seq_len or 1
    if (tokens // unit) % shards == 0:
        return []
    readers = f"{settings.data_shards} data/shard/expert rank(s)" + (
        f" x {settings.tensor} sequence-parallel rank(s)" if settings.sequence_parallel else ""
    )
    what = f"rows ({tokens // unit} sequences of {unit})" if seq_len else "rows"
    return [
        error(
            key,
            "parallel-indivisible",
            f"{key}={tokens} {what} cannot be split evenly between the {readers} that each read their own "
            f"{'sequences' if seq_len else 'rows'}",
            f"use a multiple of {shards * unit}",
        )
    ]


__all__ = ["launch_diagnostics", "parallel_diagnostics", "read_settings", "tokens_diagnostics"]
