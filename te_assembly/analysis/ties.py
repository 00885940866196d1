"""Pass 3f, tied weights: a step's ``tie_weight`` names the step whose weight its own is.

The classic use is a language model's vocabulary head sharing the embedding's weight (``[vocab,
hidden]`` both: the embedding looks rows up, the head multiplies by it). Both engines then hold one
Parameter that gets both gradients; state dicts, checkpoints and pretrained directories store it once,
under the name of the step it is tied to (``Plan.tied_params``), and ``explain`` counts it once.
"""

from __future__ import annotations

from collections.abc import Sequence

from te_assembly.analysis.plan import PlannedStep
from te_assembly.diagnostics import Diagnostic, did_you_mean, error


def check_ties(steps: Sequence[PlannedStep | None]) -> list[Diagnostic]:
    by_name = {s.name: s for s in steps if s is not None}
    out: list[Diagnostic] = []
    for step in steps:
        if step is None:
            continue
        needs = getattr(step.spec, "tie_required", None)
        if step.tie_weight is None and needs is not None and step.args.get(needs):
            out.append(
                error(
                    f"model.ops[{step.index}].tie_weight",
                    "cannot-tie",
                    f"{step.type} step {step.name!r} has {needs}: true, which reads another step's weight as "
                    f"its {step.spec.tie_param}: tie_weight names none",
                    f"tie_weight: {_before(steps, step)} (the step it adapts)",
                )
            )
        if step.tie_weight is None:
            continue
        path = f"model.ops[{step.index}].tie_weight"
        name = step.tie_weight
        owner = by_name.get(name)
        if step.spec.tie_param is None:
            tieable = sorted({s.type for s in by_name.values() if s.spec.tie_param is not None}) or ["Linear"]
            out.append(
                error(
                    path,
                    "cannot-tie",
                    f"{step.type} step {step.name!r} has no weight that can be tied",
                    f"tie a step of one of: {', '.join(tieable)}",
                )
            )
            continue
        if owner is None:
            out.append(
                error(
                    path,
                    "unknown-step",
                    f"tie_weight: {name!r} is no step of this model",
                    did_you_mean(name, by_name) or "name a step by its full name (layers.0.qkv)",
                )
            )
            continue
        problem = _problem(step, owner)
        if problem is not None:
            out.append(error(path, "cannot-tie", problem[0], problem[1]))
    return out


def _before(steps: Sequence[PlannedStep | None], step: PlannedStep) -> str:
    earlier = [s for s in steps if s is not None and s.index == step.index - 1]
    return earlier[0].name if earlier else "<step>"


def _problem(step: PlannedStep, owner: PlannedStep) -> tuple[str, str] | None:
    """What makes tying ``step``'s weight to ``owner``'s impossible, with the fix; None when it is fine."""
    if owner.name == step.name:
        return f"step {step.name!r} ties its weight to itself", "name another step"
    if owner.spec.tie_param is None:
        return f"{owner.type} step {owner.name!r} has no weight to share", "name an Embedding or Linear step"
    if owner.tie_weight is not None:
        return (
            f"step {owner.name!r} is itself tied to {owner.tie_weight!r}",
            f"tie to {owner.tie_weight!r} directly",
        )
    for tied in (step, owner):
        if tied.args.get("tensor_parallel_mode") is not None:
            return (
                f"step {tied.name!r} is split across tensor-parallel ranks: a tied weight must be whole",
                "leave tensor_parallel_mode unset on tied steps",
            )
    if not (step.args_valid and owner.args_valid):
        return None  # its argument errors are reported already; the shapes are not known
    mine = step.param_shapes.get(step.spec.tie_param or "")
    theirs = owner.param_shapes.get(owner.spec.tie_param or "")
    if mine != theirs:
        return (
            f"step {step.name!r}'s weight is {mine}, step {owner.name!r}'s is {theirs}: a tied weight "
            "has one shape",
            "a head tied to an Embedding(num_embeddings=V, embedding_dim=H) is a Linear(in_features=H, "
            "out_features=V)",
        )
    return None


__all__ = ["check_ties"]
