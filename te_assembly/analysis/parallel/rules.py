"""The rules a parallel layout must satisfy, as diagnostics with key paths. Pure Python.

Read by ``layout.shard_plan``; every rule comes from the catalog's sharding table. Tensor-parallel
regions (a column Linear, ops that work on a slice of the features, a row Linear) are checked whenever a
step is marked, so a config is valid at every tensor size or at none; divisibility only for the sizes
asked for; expert rules only under ``parallel.expert > 1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from te_assembly.analysis.parallel.settings import ParallelSettings
from te_assembly.analysis.plan import Plan, PlannedStep
from te_assembly.catalog import OpSpec, Slot
from te_assembly.catalog.sharding import Sharding
from te_assembly.diagnostics import Diagnostic, error, warning

TP_MODE = "tensor_parallel_mode"
ROW_SHAPES = ("main", "rows", "token_topk")
"""Slot shapes with one entry per row of the main path: they follow the rows when rows are split."""


@dataclass(frozen=True)
class PublicRows:
    """How a public input's rows are cut between ranks: by data shard, and by tensor rank too when
    sequence parallelism splits the rows where it is consumed."""

    name: str
    rows_split: bool


@dataclass
class Region:
    """A column Linear, the steps on its feature slice, and the row Linear that closes it."""

    column: int
    steps: list[int] = field(default_factory=list)
    gated: list[int] = field(default_factory=list)
    row: int | None = None


def step_path(step: PlannedStep, key: str) -> str:
    return f"model.ops[{step.index}].{key}"


def tp_mode(step: PlannedStep) -> Any:
    return step.args.get(TP_MODE) if step.kind == "op" else None


def tensor_regions(plan: Plan, entries: dict[int, Sharding]) -> tuple[list[Region], list[Diagnostic]]:
    """Walk the main path: a column Linear opens a region of split features, a row Linear closes it."""
    diags: list[Diagnostic] = []
    regions: list[Region] = []
    open_region: Region | None = None
    for step in plan.steps:
        entry = entries[step.index]
        mode = tp_mode(step) if entry.tensor == "linear" else None
        if open_region is None:
            if mode == "column":
                open_region = Region(step.index)
                regions.append(open_region)
            elif mode == "row":
                diags.append(_row_without_column(step))
            continue
        if mode == "row":
            open_region.row = step.index
            open_region = None
            continue
        problem = _inside_region(plan, step, entry, mode, open_region)
        if problem is not None:
            diags.append(problem)
        else:
            open_region.steps.append(step.index)
            if entry.tensor == "gated":
                open_region.gated.append(step.index)
    if open_region is not None:
        opened = plan.steps_by_index[open_region.column]
        diags.append(
            error(
                step_path(opened, f"args.{TP_MODE}"),
                "parallel-unclosed-column",
                f"column-parallel {opened.name!r} is never closed by a row-parallel Linear: the model's "
                "output would stay split across the tensor-parallel ranks",
                f"mark a later Linear {TP_MODE}: row",
            )
        )
    return regions, diags


def _row_without_column(step: PlannedStep) -> Diagnostic:
    return error(
        step_path(step, f"args.{TP_MODE}"),
        "parallel-row-without-column",
        f"row-parallel {step.name!r} ({step.type}) needs its input features split by a column-parallel "
        "Linear before it, and none is open here",
        "mark the Linear that widens the features tensor_parallel_mode: column, or drop this mode",
    )


def _inside_region(
    plan: Plan, step: PlannedStep, entry: Sharding, mode: Any, region: Region
) -> Diagnostic | None:
    """Why ``step`` cannot work on the feature slice of an open region, or None when it can."""
    where = f"{step.name!r} ({step.type})"
    opened = plan.steps_by_index[region.column]
    inside = (
        f"between the column-parallel {opened.name!r} (model.ops[{opened.index}]) and its row-parallel Linear"
    )
    if mode == "column":
        return error(
            step_path(step, f"args.{TP_MODE}"),
            "parallel-column-in-region",
            f"column-parallel {where} needs whole input features, but it sits {inside}",
            "close the open region with a row-parallel Linear first",
        )
    if entry.tensor == "linear":
        return error(
            step_path(step, f"args.{TP_MODE}"),
            "parallel-unmarked-linear",
            f"{where} receives a slice of the features: it sits {inside}",
            f"mark it {TP_MODE}: row",
        )
    if entry.tensor == "replicated":
        return error(
            step_path(step, "op" if step.kind == "op" else "module"),
            "parallel-needs-whole-features",
            f"{where} needs whole feature vectors; it cannot sit {inside}",
            entry.note
            or "move it outside the region, or end the region before it with a row-parallel Linear",
        )
    return None


def blocks(regions: list[Region]) -> tuple[dict[int, int], dict[int, int]]:
    """Interleaved pieces of the split tensor arriving at each step in a region, and at each column."""
    blocks_in: dict[int, int] = {}
    column_blocks: dict[int, int] = {}
    for region in regions:
        blocks = 2 ** len(region.gated)
        column_blocks[region.column] = blocks
        for index in region.steps:
            blocks_in[index] = blocks
            if index in region.gated:
                blocks //= 2
    return blocks_in, column_blocks


def divisibility(
    plan: Plan,
    settings: ParallelSettings,
    entries: dict[int, Sharding],
    regions: list[Region],
    column_blocks: dict[int, int],
) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    size = settings.tensor
    if size > 1:
        for region in regions:
            step = plan.steps_by_index[region.column]
            blocks = column_blocks[region.column]
            width = step.args.get("out_features")
            if isinstance(width, int) and width % (size * blocks):
                pieces = (
                    f"{size} tensor-parallel slices"
                    if blocks == 1
                    else (
                        f"{blocks} interleaved pieces (gated activation halves), each split into {size} "
                        "tensor-parallel slices"
                    )
                )
                out.append(
                    error(
                        step_path(step, "args.out_features"),
                        "parallel-indivisible",
                        f"out_features={width} of column-parallel {step.name!r} is cut into {pieces}: it "
                        f"must be divisible by {size * blocks}",
                        f"use a multiple of {size * blocks}, or a parallel.tensor that divides "
                        f"{width // blocks}",
                    )
                )
            if region.row is not None:
                row = plan.steps_by_index[region.row]
                width = row.args.get("in_features")
                if isinstance(width, int) and width % size:
                    out.append(
                        error(
                            step_path(row, "args.in_features"),
                            "parallel-indivisible",
                            f"in_features={width} of row-parallel {row.name!r} must be divisible by "
                            f"parallel.tensor={size}",
                        )
                    )
    if settings.expert > 1:
        for step in plan.steps:
            entry = entries[step.index]
            key = entry.expert_count
            if key is None or entry.expert not in ("experts", "dispatch"):
                continue
            count = step.args.get(key)
            if isinstance(count, int) and count % settings.expert:
                out.append(
                    error(
                        step_path(step, f"args.{key}"),
                        "parallel-indivisible",
                        f"{key}={count} of {step.name!r} ({step.type}) cannot be split evenly across "
                        f"parallel.expert={settings.expert} ranks",
                        f"use a multiple of {settings.expert} experts, or a parallel.expert that "
                        f"divides {count}",
                    )
                )
    return out


def channel_regions(plan: Plan, split_at: set[int], rows_split: dict[int, bool]) -> list[Diagnostic]:
    """A channel joins two steps: the tensor must be cut the same way at both ends."""
    out: list[Diagnostic] = []
    steps = plan.steps_by_index
    for name, channel in plan.channels.items():
        producer = steps[channel.producer.step]
        produced = producer.output_slots[channel.producer.slot]
        if produced.shape not in ROW_SHAPES:
            continue
        # A slot carries the tensor as it arrives at its step (features split? rows split?).
        made = (producer.index in split_at, rows_split[producer.index])
        for ref in channel.consumers:
            consumer = steps[ref.step]
            wanted = (consumer.index in split_at, rows_split[consumer.index])
            features_differ = produced.shape == "main" and made[0] != wanted[0]
            if features_differ:
                where = {True: "a slice of the features (tensor-parallel region)", False: "whole features"}
                out.append(
                    error(
                        f"model.ops[{ref.step}].extra_inputs.{ref.slot_name}",
                        "parallel-channel-region",
                        f"channel {name!r} carries {where[made[0]]} from step {producer.name!r} but step "
                        f"{consumer.name!r} works on {where[wanted[0]]}",
                        "consume it on the same side of the column/row-parallel Linears as it was made",
                    )
                )
            elif made[1] != wanted[1]:
                out.append(
                    error(
                        f"model.ops[{ref.step}].extra_inputs.{ref.slot_name}",
                        "parallel-channel-region",
                        f"channel {name!r} carries rows split by sequence parallelism at step "
                        f"{producer.name!r} but whole rows at step {consumer.name!r} (or the other way "
                        "round)",
                        "consume it on the same side of the column/row-parallel Linears as it was made",
                    )
                )
    return out


def _slot_depth(step: PlannedStep, slot: Slot, output: bool) -> int:
    depth = step.row_depth or 0
    if output and slot.shape == "rows" and isinstance(step.spec, OpSpec):
        depth += step.spec.rows_delta
    return depth


def expert_rules(plan: Plan, settings: ParallelSettings, entries: dict[int, Sharding]) -> list[Diagnostic]:
    """What ``parallel.expert > 1`` needs of the model: experts between one Dispatch and its Combine,
    the rows that stay with the tokens read by that Combine alone, no public tensor of dispatched rows."""
    if settings.expert == 1:
        return []
    out: list[Diagnostic] = []
    for step in plan.steps:
        out.extend(_expert_step(plan, step, entries))
    for name, channel in plan.channels.items():
        producer = plan.steps_by_index[channel.producer.step]
        entry = entries[producer.index]
        slot = producer.output_slots[channel.producer.slot]
        if entry.expert != "dispatch" or slot.name not in entry.stays:
            continue
        for ref in channel.consumers:
            if entries[ref.step].expert != "combine":
                out.append(
                    error(
                        f"model.ops[{ref.step}].extra_inputs.{ref.slot_name}",
                        "parallel-stays-with-tokens",
                        f"channel {name!r} ({producer.name}.{slot.name}) stays on the tokens' rank under "
                        "expert parallelism; only a Combine can read it",
                    )
                )
    out.extend(_public_expert_rows(plan))
    return out


def _expert_step(plan: Plan, step: PlannedStep, entries: dict[int, Sharding]) -> list[Diagnostic]:
    entry, depth, path = entries[step.index], step.row_depth or 0, step_path(step, "op")
    out: list[Diagnostic] = []
    if entry.expert == "experts" and depth != 1:
        message = (
            f"{step.name!r} ({step.type}) is not between a Dispatch and a Combine: its groups are not "
            "experts holding dispatched rows, so parallel.expert cannot split them"
        )
        out.append(error(path, "parallel-experts-outside-dispatch", message))
    if entry.expert == "dispatch" and depth != 0:
        out.append(
            error(
                path, "parallel-nested-dispatch", "expert parallelism supports one level of Dispatch/Combine"
            )
        )
    if entry.expert == "dispatch":
        covered = {*entry.exchanged, *entry.stays, *((entry.group_counts,) if entry.group_counts else ())}
        missing = [s.name for s in step.output_slots if s.name not in covered]
        if missing:
            message = (
                f"the catalog's sharding entry for {step.type} does not say where output(s) "
                f"{', '.join(missing)} go under expert parallelism"
            )
            out.append(error(path, "parallel-undeclared", message))
    if entry.expert == "combine":
        for slot, bound in zip(step.input_slots, step.input_channels, strict=True):
            producer = plan.steps_by_index[plan.channels[bound].producer.step] if bound is not None else None
            source = entries[producer.index] if producer is not None else None
            if source is None or source.expert != "dispatch" or slot.name not in source.stays:
                message = (
                    f"under expert parallelism {step.name!r} must take {slot.name} from the Dispatch "
                    "whose rows it brings back (a channel), not from the caller or another op"
                )
                where = f"model.ops[{step.index}].extra_inputs.{slot.name}"
                out.append(error(where, "parallel-combine-unpaired", message))
    return out


def _public_expert_rows(plan: Plan) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    for direction, tensors in (("input", plan.public_inputs), ("output", plan.public_outputs)):
        for tensor in tensors:
            step = plan.steps_by_index[tensor.ref.step]
            slots = step.input_slots if direction == "input" else step.output_slots
            slot = slots[tensor.ref.slot]
            if slot.shape == "scalar" or _slot_depth(step, slot, direction == "output") < 1:
                continue
            key = "extra_inputs" if direction == "input" else "extra_outputs"
            out.append(
                error(
                    f"model.ops[{step.index}].{key}.{slot.name}",
                    "parallel-public-expert-rows",
                    f"public {direction} {tensor.name!r} belongs to dispatched rows, which live on other "
                    "ranks under expert parallelism",
                    "bind it to a channel, or use parallel.expert=1",
                )
            )
    return out


def public_rows(
    plan: Plan, settings: ParallelSettings, split_at: set[int], rows_split: dict[int, bool]
) -> tuple[list[PublicRows], list[Diagnostic]]:
    """Public inputs are cut by rows like ``x``; one without rows (split sizes...) cannot be."""
    out: list[PublicRows] = []
    diags: list[Diagnostic] = []
    steps = plan.steps_by_index
    for tensor in plan.public_inputs:
        step = steps[tensor.ref.step]
        slot = step.input_slots[tensor.ref.slot]
        out.append(PublicRows(tensor.name, rows_split[step.index]))
        if settings.tensor > 1 and slot.shape == "main" and step.index in split_at:
            diags.append(
                error(
                    f"model.ops[{step.index}].extra_inputs.{slot.name}",
                    "parallel-public-split-features",
                    f"public input {tensor.name!r} would arrive as a slice of the features inside a "
                    "tensor-parallel region",
                    "bind it to a channel, or move its consumer outside the region",
                )
            )
        elif settings.row_shards > 1 and slot.shape not in ROW_SHAPES:
            diags.append(
                error(
                    f"model.ops[{step.index}].extra_inputs.{slot.name}",
                    "parallel-public-unsplittable",
                    f"public input {tensor.name!r} ({slot.shape}-shaped) has no rows to split between the "
                    f"{settings.row_shards} ranks that read different rows of the batch",
                    "bind it to a channel",
                )
            )
    for tensor in plan.public_outputs:
        step = steps[tensor.ref.step]
        slot = step.output_slots[tensor.ref.slot]
        if settings.tensor > 1 and slot.shape == "main" and step.index in split_at:
            diags.append(
                error(
                    f"model.ops[{step.index}].extra_outputs.{slot.name}",
                    "parallel-public-split-features",
                    f"public output {tensor.name!r} would be a slice of the features on each "
                    "tensor-parallel rank",
                    "make it public: false, or tap it outside the region",
                )
            )
    return out, diags


def sequence_rules(plan: Plan, settings: ParallelSettings, entries: dict[int, Sharding]) -> list[Diagnostic]:
    """Sequence parallelism splits the main path's rows between tensor-parallel ranks: a step that mixes
    the positions of a sequence (``whole_sequences`` in the catalog) cannot run on such a slice."""
    if not settings.sequence_parallel:
        return []
    out = []
    for step in plan.steps:
        if entries[step.index].whole_sequences:
            out.append(
                error(
                    "parallel.sequence",
                    "parallel-sequence-attention",
                    f"sequence parallelism splits the rows of the main path between the tensor-parallel "
                    f"ranks, but {step.name!r} ({step.type}, {step_path(step, step.kind)}) mixes the "
                    "positions of whole sequences",
                    "drop parallel.sequence (keep parallel.sequence: 1)",
                )
            )
    return out


def warnings_for(
    plan: Plan, settings: ParallelSettings, entries: dict[int, Sharding], regions: list[Region]
) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    if settings.tensor > 1 and not regions:
        out.append(
            warning(
                "parallel.tensor",
                "parallel-nothing-split",
                f"parallel.tensor={settings.tensor} but no Linear of {plan.name} is marked "
                f"{TP_MODE}: every tensor-parallel rank computes the same thing",
                f"mark Linear pairs {TP_MODE}: column / row",
            )
        )
    if settings.expert > 1 and not any(e.expert == "experts" for e in entries.values()):
        out.append(
            warning(
                "parallel.expert",
                "parallel-nothing-split",
                f"parallel.expert={settings.expert} but {plan.name} has no expert layer: the expert ranks "
                "only split the batch, like data-parallel ranks",
            )
        )
    if settings.sequence_parallel and any(e.expert_count for e in entries.values()):
        out.append(
            warning(
                "parallel.sequence",
                "parallel-sequence-moe",
                "sequence parallelism with MoE ops: the router's load-balancing loss is computed on each "
                "rank's rows, not on the whole sequence",
            )
        )
    return out
