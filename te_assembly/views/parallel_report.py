"""``explain``'s view of a parallel layout: what each rank holds. Formatting only; pure Python."""

from __future__ import annotations

import math

from rich.table import Table

from te_assembly.analysis.parallel.layout import ShardPlan, local_param_shapes, rank_coordinates
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


def layout_tables(plan: Plan, layout: ShardPlan) -> list[Table]:
    """Per step: each parameter's global and local shape and how it is cut; per rank: its coordinates
    and the parameters it holds."""
    s = layout.settings
    title = f"parallel layout: {s.describe()}"
    steps = Table(title=title, title_justify="left")
    for col in ("step", "role", "parameter", "global shape", "local shape", "held by"):
        steps.add_column(col)
    for planned, shard in zip(plan.steps, layout.steps, strict=True):
        tensor_role = _TENSOR_ROLE[shard.tensor_role] if s.tensor > 1 else ""
        expert_role = _EXPERT_ROLE[shard.expert_role] if s.expert > 1 else ""
        roles = [r for r in (tensor_role, expert_role) if r]
        if shard.rows_split:
            roles.append("rows split (sequence parallel)")
        role = "; ".join(roles)
        shapes = planned.param_shapes
        if not shapes:
            steps.add_row(shard.name, role, "-", "", "", "")
        groups = shard.local_groups
        for name, shape in shapes.items():
            rule = shard.params[name]
            if rule.kind == "tensor":
                local = list(shape)
                local[rule.dim] //= s.tensor
                how = f"dim {rule.dim} split" + (
                    f", {rule.blocks} interleaved pieces" if rule.blocks > 1 else ""
                )
                steps.add_row(shard.name, role, name, _shape(shape), _shape(tuple(local)), how)
            elif rule.kind == "expert":
                owner = rule.group // groups if groups else 0
                local_index = rule.group - owner * groups
                steps.add_row(
                    shard.name,
                    role,
                    name,
                    _shape(shape),
                    _shape(shape),
                    f"expert rank {owner} as {rule.prefix}{local_index}",
                )
            else:
                steps.add_row(shard.name, role, name, _shape(shape), _shape(shape), "every rank")
            role = ""
    ranks = Table(title="parameters per rank", title_justify="left")
    for col in ("rank", "data", "expert", "tensor", "rows per batch", "parameters", "of global"):
        ranks.add_column(col, justify="right")
    total = plan.num_params
    for rank, d, _z, e, t in rank_coordinates(s):
        held = sum(
            math.prod(shape)
            for planned, shard in zip(plan.steps, layout.steps, strict=True)
            for shape in local_param_shapes(planned, shard, s, e).values()
        )
        share = f"{held / total:.0%}" if total else "-"
        rows = f"1/{s.row_shards}"
        ranks.add_row(str(rank), str(d), str(e), str(t), rows, f"{held:,}", share)
    return [steps, ranks]


__all__ = ["layout_tables"]
