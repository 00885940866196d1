"""A plan as plain data: every step with its arguments (catalog defaults filled in) and its channel
bindings, the dims. Checkpoints record it (a resume must rebuild exactly this model), pretrained
directories keep it as their ``config.yaml``'s model, and ``te_assembly.load`` takes it back."""

from __future__ import annotations

from typing import Any

from te_assembly.analysis.plan import Plan


def model_record(plan: Plan) -> dict[str, Any]:
    """The model exactly as it was built: what a resumed run must rebuild to continue the same run."""
    ops = []
    for step in plan.steps:
        entry: dict[str, Any] = {"name": step.name, step.kind: step.type, "args": dict(step.args)}
        if step.input_slots:
            entry["extra_inputs"] = {
                s.name: c for s, c in zip(step.input_slots, step.input_channels, strict=True)
            }
        if step.output_slots:
            entry["extra_outputs"] = {
                s.name: {"channel": c, "public": pub}
                for s, c, pub in zip(step.output_slots, step.output_channels, step.output_public, strict=True)
            }
        if step.tie_weight is not None:
            entry["tie_weight"] = step.tie_weight
        ops.append(entry)
    return {"name": plan.name, "in_features": plan.in_features, "dims": dict(plan.dims), "ops": ops}


__all__ = ["model_record"]
