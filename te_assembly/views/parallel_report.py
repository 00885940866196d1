"""``explain``'s view of a parallel layout: what each rank holds. Formatting only; pure Python."""

from __future__ import annotations

from rich.table import Table

from te_assembly.analysis.parallel.layout import (
    ShardPlan,
    StepShard,
    fsdp_ranks,
    rank_coordinates,
    rank_elements,
    sharded_shape,
)
from te_assembly.analysis.parallel.settings import ParallelSettings
from te_assembly.analysis.plan import Plan

_TENSOR_ROLE = {
    "replicated": "whole features",
    "column": "column: splits out features",
    "row": "row: splits in features, sums",
    "split": "on the feature slice",
}
_EXPERT_ROLE = {
    "tokens": "",
    "experts": "experts split",
    "dispatch": "rows to experts' ranks",
    "combine": "rows back",
}


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(str(n) for n in shape) or "scalar"


DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}


def _bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def layout_tables(plan: Plan, layout: ShardPlan, dtype: str = "float32") -> list[Table]:
    """Per step: each parameter's global and local shape and how it is cut; per rank: its coordinates,
    the parameters it holds, and their bytes with their gradients and AdamW's two moments in ``dtype``
    (what stays between steps: FSDP2 gathers one unit at a time on top of it)."""
    return [_step_table(plan, layout), _rank_table(plan, layout, dtype)]


def _step_table(plan: Plan, layout: ShardPlan) -> Table:
    s = layout.settings
    steps = Table(title=f"parallel layout: {s.describe()}", title_justify="left")
    for col in ("step", "role", "parameter", "global shape", "local shape", "held by"):
        steps.add_column(col)
    for planned, shard in zip(plan.steps, layout.steps, strict=True):
        role = _role(shard, s)
        shapes = planned.param_shapes
        if not shapes:
            steps.add_row(shard.name, role, "-", "", "", "")
        for name, shape in shapes.items():
            local, how = _cut(shard, name, tuple(shape), s)
            steps.add_row(shard.name, role, name, _shape(tuple(shape)), _shape(local), how)
            role = ""
    return steps


def _role(shard: StepShard, s: ParallelSettings) -> str:
    tensor_role = _TENSOR_ROLE[shard.tensor_role] if s.tensor > 1 else ""
    expert_role = _EXPERT_ROLE[shard.expert_role] if s.expert > 1 else ""
    roles = [r for r in (tensor_role, expert_role) if r]
    if shard.rows_split:
        roles.append("rows split (sequence parallel)")
    return "; ".join(roles)


def _cut(
    shard: StepShard, name: str, shape: tuple[int, ...], s: ParallelSettings
) -> tuple[tuple[int, ...], str]:
    """A parameter's shape on a rank, and where the rest is."""
    rule = shard.params[name]
    cut = fsdp_ranks(rule, s)
    fsdp = f"dim 0 FSDP2-sharded over {cut} ranks" if s.is_sharded else ""
    if s.is_sharded and rule.kind != "expert":
        return sharded_shape(shape, cut), fsdp
    if rule.kind == "tensor":
        local = list(shape)
        local[rule.dim] //= s.tensor
        pieces = f", {rule.blocks} interleaved pieces" if rule.blocks > 1 else ""
        return tuple(local), f"dim {rule.dim} split{pieces}"
    if rule.kind == "expert":
        groups = shard.local_groups
        owner = rule.group // groups if groups else 0
        local_index = rule.group - owner * groups
        held = f"expert rank {owner} as {rule.prefix}{local_index}"
        return sharded_shape(shape, cut), "; ".join(filter(None, (held, fsdp)))
    return shape, "every rank"


def _rank_table(plan: Plan, layout: ShardPlan, dtype: str) -> Table:
    s = layout.settings
    ranks = Table(title=f"parameters per rank ({dtype}; AdamW state: two moments)", title_justify="left")
    coordinates = ("data", "shard", "expert", "tensor") if s.is_sharded else ("data", "expert", "tensor")
    columns = ("rank", *coordinates, "rows per batch", "parameters", "of global")
    for col in (*columns, "parameter bytes", "gradient bytes", "AdamW state"):
        ranks.add_column(col, justify="right")
    total = plan.num_params
    size = DTYPE_BYTES.get(dtype, 4)
    for rank, d, z, e, t in rank_coordinates(s):
        held = rank_elements(plan, layout, e)
        share = f"{held / total:.0%}" if total else "-"
        where = (d, z, e, t) if s.is_sharded else (d, e, t)
        nbytes = _bytes(held * size)
        ranks.add_row(
            str(rank),
            *map(str, where),
            f"1/{s.row_shards}",
            f"{held:,}",
            share,
            nbytes,
            nbytes,
            _bytes(2 * held * size),
        )
    if s.is_sharded:
        ranks.caption = (
            "FSDP2 cuts each parameter's first dimension across the shard ranks"
            + (", and the expert ranks for all but the experts" if s.expert > 1 else "")
            + " (the last piece padded)"
        )
    return ranks


__all__ = ["layout_tables"]
