"""Which rank holds which slice of what: the parallel layout of a plan, decided before any process exists.

Pure Python (no torch): ``validate`` and ``explain`` call it, and the sharded engines, the gradient
reductions and the checkpoint gather read the same ``ShardPlan``. Every rule comes from the catalog's
sharding table (``catalog/sharding.py``), never from op names; the rules a layout must satisfy are in
``rules.py``.

Tensor parallelism follows Megatron-LM's pattern as TE's ``BasicLinear`` implements it: a Linear marked
``tensor_parallel_mode: column`` splits its output features, the ops after it run on that slice, and a
Linear marked ``row`` splits its input features and sums the partial outputs (all-reduce). When gated
activations (SwiGLU...) sit between the two, the column Linear's output is cut into interleaved pieces so
each rank holds matching slices of both halves. Expert parallelism gives each rank ``experts / expert``
consecutive experts; Dispatch sends the rows to their expert's rank, Combine brings them back.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from te_assembly.analysis.parallel.rules import (
    PublicRows,
    blocks,
    channel_regions,
    divisibility,
    expert_rules,
    public_rows,
    sequence_rules,
    step_path,
    tensor_regions,
    tp_mode,
    warnings_for,
)
from te_assembly.analysis.parallel.settings import ParallelSettings
from te_assembly.analysis.plan import Plan, PlannedStep
from te_assembly.catalog.sharding import Sharding, sharding_of
from te_assembly.diagnostics import Diagnostic, error


@dataclass(frozen=True)
class ParamShard:
    """How one parameter (by its global name in the step) is laid out across ranks."""

    kind: str
    """``replicated`` (every rank holds all of it), ``tensor`` (sliced along ``dim`` across the
    tensor-parallel ranks) or ``expert`` (held whole by the expert rank that owns group ``group``)."""
    dim: int = 0
    blocks: int = 1
    """``tensor``: the dimension is cut into ``blocks`` equal pieces first and each rank takes its slice of
    every piece (the two halves of a gated activation's input)."""
    group: int = 0
    prefix: str = ""
    """``expert``: ``<prefix><group>`` globally, ``<prefix><group - first local group>`` on its rank."""


@dataclass(frozen=True)
class StepShard:
    index: int
    name: str
    tensor_role: str
    """``replicated`` (whole features: every tensor rank runs it in full), ``column`` / ``row`` (a split
    Linear), ``split`` (runs on the slice of the features between a column and a row Linear)."""
    blocks: int
    """``column``: interleaved pieces of its output; ``split``: pieces of the tensor arriving."""
    expert_role: str
    """``tokens``, ``experts``, ``dispatch`` or ``combine`` (catalog sharding)."""
    rows_split: bool
    """Sequence parallelism: the main path's rows arriving here are split across the tensor ranks."""
    local_args: dict[str, Any]
    """Constructor arguments on every rank (GroupedLinear's ``num_groups`` becomes the local count)."""
    params: dict[str, ParamShard] = field(default_factory=dict)
    """Global parameter name (as the catalog's ``param_shapes`` names it) -> layout."""
    pair: int | None = None
    """``combine``: index of the Dispatch step whose rows it brings back."""
    sharding: Sharding = field(default_factory=Sharding)
    """The catalog's entry for the step's op or module."""

    @property
    def tensor_mode(self) -> str | None:
        return self.tensor_role if self.tensor_role in ("column", "row") else None

    @property
    def local_groups(self) -> int:
        """``experts``: groups (experts) held by each rank."""
        key = self.sharding.expert_count
        return int(self.local_args[key]) if self.expert_role == "experts" and key else 0


@dataclass
class ShardPlan:
    settings: ParallelSettings
    steps: list[StepShard]
    public_inputs: list[PublicRows] = field(default_factory=list)
    warnings: list[Diagnostic] = field(default_factory=list)

    def step(self, name: str) -> StepShard:
        return next(s for s in self.steps if s.name == name)

    @property
    def by_name(self) -> dict[str, StepShard]:
        return {s.name: s for s in self.steps}

    @property
    def has_tensor_split(self) -> bool:
        return any(s.tensor_role == "column" for s in self.steps)

    @property
    def rows_split(self) -> bool:
        """Sequence parallelism: ``x`` and ``y`` are split by rows across the tensor ranks (a valid plan
        starts and ends outside tensor-parallel regions)."""
        return self.settings.sequence_parallel


# ----------------------------------------------------------------------------------------- parameters


def local_name(global_name: str, rule: ParamShard, expert_rank: int, local_groups: int) -> str | None:
    """A parameter's name on a rank of expert rank ``expert_rank``; None when that rank does not hold it."""
    if rule.kind != "expert":
        return global_name
    first = expert_rank * local_groups
    if not first <= rule.group < first + local_groups:
        return None
    return f"{rule.prefix}{rule.group - first}"


def local_shape(shape: tuple[int, ...], rule: ParamShard, tensor_size: int) -> tuple[int, ...]:
    if rule.kind != "tensor":
        return shape
    out = list(shape)
    out[rule.dim] //= tensor_size
    return tuple(out)


def slice_rows(size: int, rule: ParamShard, tensor_rank: int, tensor_size: int) -> list[tuple[int, int]]:
    """The [start, stop) ranges of a ``tensor`` parameter's split dimension that ``tensor_rank`` holds, in
    order: one per interleaved piece."""
    piece = size // rule.blocks
    part = piece // tensor_size
    return [
        (b * piece + tensor_rank * part, b * piece + (tensor_rank + 1) * part) for b in range(rule.blocks)
    ]


REPLICATED = ParamShard("replicated")


# ------------------------------------------------------------------------------------------- planning


def shard_plan(plan: Plan, settings: ParallelSettings) -> tuple[ShardPlan | None, list[Diagnostic]]:
    """The layout of ``plan`` under ``settings``, or None and every reason it cannot be split so.

    Structure (a column Linear closed by a row Linear, nothing between them that needs whole features)
    is checked whenever a step is marked, so a config is valid at every tensor size or at none;
    divisibility only for the sizes asked for."""
    diags: list[Diagnostic] = []
    entries: dict[int, Sharding] = {}
    for step in plan.steps:
        entry = sharding_of(step.kind, step.type)
        if entry is None:
            if settings.is_parallel:
                diags.append(
                    error(
                        step_path(step, "op" if step.kind == "op" else "module"),
                        "parallel-undeclared",
                        f"{step.type} has no sharding entry in the catalog (catalog/sharding.py), so no "
                        "parallel layout can place it",
                    )
                )
            entry = Sharding()
        entries[step.index] = entry
    regions, state_diags = tensor_regions(plan, entries)
    diags.extend(state_diags)
    blocks_in, column_blocks = blocks(regions)
    split_at = {i for r in regions for i in r.steps}
    rows = {r.row for r in regions}
    # Sequence parallelism: rows arrive split everywhere but inside a region and at its row Linear (a
    # column Linear gathers them, a row Linear scatters them again).
    rows_split = {
        s.index: settings.sequence_parallel and s.index not in split_at and s.index not in rows
        for s in plan.steps
    }
    diags.extend(divisibility(plan, settings, entries, regions, column_blocks))
    diags.extend(channel_regions(plan, split_at, rows_split))
    diags.extend(expert_rules(plan, settings, entries))
    diags.extend(sequence_rules(plan, settings, entries))
    public, public_diags = public_rows(plan, settings, split_at, rows_split)
    diags.extend(public_diags)
    warnings = warnings_for(plan, settings, entries, regions)
    if any(d.is_error for d in diags):
        return None, [*diags, *warnings]
    steps = []
    for step in plan.steps:
        entry = entries[step.index]
        steps.append(
            _step_shard(step, entry, settings, split_at, column_blocks, blocks_in, rows_split[step.index])
        )
    _pair_combines(plan, steps, entries)
    return ShardPlan(settings, steps, public, warnings), warnings


def _step_shard(
    step: PlannedStep,
    entry: Sharding,
    settings: ParallelSettings,
    split_at: set[int],
    column_blocks: dict[int, int],
    blocks_in: dict[int, int],
    rows_split: bool,
) -> StepShard:
    shapes = step.param_shapes
    params: dict[str, ParamShard] = {}
    mode = tp_mode(step) if entry.tensor == "linear" else None
    local_args = dict(step.args)
    if mode == "column":
        role, blocks = "column", column_blocks[step.index]
        for name in shapes:
            params[name] = ParamShard("tensor", 0, blocks)  # weight rows and bias: the output features
    elif mode == "row":
        role, blocks = "row", 1
        for name, shape in shapes.items():
            # The bias is added once, after the reduction (parallel/tensor_ops.py): every rank holds it whole.
            params[name] = ParamShard("tensor", 1, 1) if len(shape) == 2 else REPLICATED
    elif step.index in split_at:
        role, blocks = "split", blocks_in[step.index]
        for name, dim in entry.split_params:
            if name in shapes:
                params[name] = ParamShard("tensor", dim, blocks)
    else:
        role, blocks = "replicated", 1
    if entry.expert == "experts" and settings.expert > 1 and entry.expert_count is not None:
        groups = int(step.args[entry.expert_count])
        local_args[entry.expert_count] = groups // settings.expert
        for prefix in entry.group_params:
            for g in range(groups):
                if f"{prefix}{g}" in shapes:
                    params[f"{prefix}{g}"] = ParamShard("expert", group=g, prefix=prefix)
    for name in shapes:
        params.setdefault(name, REPLICATED)
    return StepShard(
        step.index, step.name, role, blocks, entry.expert, rows_split, local_args, params, sharding=entry
    )


def _pair_combines(plan: Plan, steps: list[StepShard], entries: dict[int, Sharding]) -> None:
    by_index = {s.index: s for s in steps}
    for step in plan.steps:
        if entries[step.index].expert != "combine":
            continue
        for channel in step.input_channels:
            if channel is not None:
                producer = plan.channels[channel].producer.step
                if entries[producer].expert == "dispatch":
                    by_index[step.index] = dataclasses.replace(by_index[step.index], pair=producer)
    steps[:] = [by_index[s.index] for s in steps]


def rank_coordinates(settings: ParallelSettings) -> Iterator[tuple[int, int, int, int, int]]:
    """(rank, data rank, shard rank, expert rank, tensor rank) of every rank, tensor-fastest."""
    for d in range(settings.data):
        for s in range(settings.shard):
            for e in range(settings.expert):
                for t in range(settings.tensor):
                    yield ((d * settings.shard + s) * settings.expert + e) * settings.tensor + t, d, s, e, t


def sharded_shape(shape: tuple[int, ...], shard: int) -> tuple[int, ...]:
    """The piece of ``shape`` one FSDP2 rank of ``shard`` keeps: dimension 0 cut into ``shard`` equal
    pieces, the last padded (``fully_shard`` allocates every rank's piece at the padded size)."""
    if shard == 1 or not shape:
        return shape
    return (-(-shape[0] // shard), *shape[1:])


def sharded_elements(shape: tuple[int, ...], shard: int) -> int:
    """Elements of the piece ``sharded_shape`` gives."""
    return math.prod(sharded_shape(shape, shard))


def fsdp_ranks(rule: ParamShard, settings: ParallelSettings) -> int:
    """Across how many ranks FSDP2 cuts a parameter laid out by ``rule``: an expert's across the shard
    ranks of its expert rank; any other across the shard and expert ranks together, which all hold it
    alike (``engines/parallel/mesh.fsdp_meshes``). 1 without ``parallel.shard``."""
    if settings.shard == 1:
        return 1
    return settings.shard if rule.kind == "expert" else settings.shard * settings.expert


def rank_elements(plan: Plan, layout: ShardPlan, expert_rank: int = 0) -> int:
    """Parameter elements a rank of ``expert_rank`` keeps between steps: its tensor/expert slices, and
    under FSDP2 its piece of each. A tied weight counts once."""
    settings = layout.settings
    tied = {alias.removeprefix("steps.") for alias in plan.tied_params}
    total = 0
    for step, shard in zip(plan.steps, layout.steps, strict=True):
        groups = shard.local_groups
        for name, shape in step.param_shapes.items():
            rule = shard.params.get(name, REPLICATED)
            local = local_name(name, rule, expert_rank, groups)
            if local is None or f"{step.name}.{local}" in tied:
                continue
            piece = local_shape(tuple(shape), rule, settings.tensor)
            total += sharded_elements(piece, fsdp_ranks(rule, settings))
    return total


__all__ = [
    "REPLICATED",
    "ParamShard",
    "PublicRows",
    "ShardPlan",
    "StepShard",
    "fsdp_ranks",
    "local_name",
    "local_shape",
    "rank_coordinates",
    "rank_elements",
    "shard_plan",
    "sharded_elements",
    "sharded_shape",
    "slice_rows",
]
