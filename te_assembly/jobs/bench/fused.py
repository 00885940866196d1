"""What TE's fusers fused in a benchmarked model: read from the fusers after they have run (TE keeps
the list in its private ``_forward_ops``/``_backward_ops``: it has no public one), beside what
``analysis/fusions.py`` predicted for the same ops."""

from __future__ import annotations

from typing import Any

import torch

from te_assembly.analysis.fusions import FusionTarget, basic_ops, predict
from te_assembly.analysis.plan import Plan


def fired_fusions(plan: Plan, model: torch.nn.Module, target: FusionTarget) -> list[dict[str, Any]]:
    """Per fuser of a TE model: the fused ops TE chose (forward and backward: fused op, steps) and the
    prediction; empty for a model that is not TE's (the reference engine fuses nothing)."""
    fusers = getattr(model, "fusers", None)
    if not fusers:
        return []
    out = []
    for fuser, expected in zip(fusers, predict(plan, target), strict=True):
        ops = basic_ops(plan, expected.fuser)
        entry: dict[str, Any] = {"fuser": expected.fuser}
        for direction, recorded in (("forward", "_forward_ops"), ("backward", "_backward_ops")):
            entry[direction] = [
                {"op": type(op).__name__, "steps": sorted({ops[i].step.name for i in idx})}
                for op, idx in getattr(fuser, recorded, None) or []
                if op.is_fused_op
            ]
        joint = [f for f in expected.forward if f.fusion.passes == "joint"]
        entry["predicted"] = {
            "forward": [f.fusion.name for f in expected.forward],
            "backward": [f.fusion.name for f in (*joint, *expected.backward)],
        }
        out.append(entry)
    return out


__all__ = ["fired_fusions"]
