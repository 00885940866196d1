"""Cut a plan in two fusers, the way blocks were written before TE's channels: every channel that
crosses the cut becomes a public output of part 1 and a public input of part 2 (one per consumer).

The cut works on the model mapping rebuilt from the plan and re-validates both halves, so each part is
an ordinary, checked plan that any engine builds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from te_assembly.diagnostics import did_you_mean
from te_assembly.engines.base import AssembledModel, ModelOutput
from te_assembly.errors import ConfigError, TeAssemblyError
from te_assembly.plan import Plan


class SplitError(TeAssemblyError):
    """The plan cannot be cut where asked."""


@dataclass(frozen=True)
class Bridge:
    """A channel crossing the cut: returned by part 1 as ``output``, fed to part 2 as ``inputs``."""

    channel: str
    output: str
    inputs: tuple[str, ...]


@dataclass(frozen=True)
class SplitPlan:
    original: Plan
    part1: Plan
    part2: Plan
    cut: int
    """Index of the first step of part 2."""
    bridges: tuple[Bridge, ...]


def plan_to_model(plan: Plan) -> dict[str, Any]:
    """The model mapping that validates to ``plan`` (args with defaults filled in)."""
    ops: list[dict[str, Any]] = []
    for s in plan.steps:
        entry: dict[str, Any] = {"name": s.name, s.kind: s.type, "args": dict(s.args)}
        if s.kind == "op":
            pairs = zip(s.input_slots, s.input_channels, strict=True)
            bound_in = {slot.name: ch for slot, ch in pairs if ch is not None}
            bound_out = {
                slot.name: {"channel": ch, "public": public}
                for slot, ch, public in zip(s.output_slots, s.output_channels, s.output_public, strict=True)
                if ch is not None
            }
            if bound_in:
                entry["extra_inputs"] = bound_in
            if bound_out:
                entry["extra_outputs"] = bound_out
        ops.append(entry)
    return {
        "name": plan.name,
        "in_features": plan.in_features,
        "input_layout": plan.input_layout,
        "dims": dict(plan.dims),
        "ops": ops,
    }


def default_cut(plan: Plan) -> int:
    """The step boundary nearest the middle that falls inside a fuser (so the cut adds a fuser
    boundary); any boundary when no fuser has two steps."""
    n = len(plan.steps)
    if n < 2:
        raise SplitError(f"{plan.name} has {n} step(s): nothing to split")
    inside = [
        k
        for k in range(1, n)
        if plan.steps[k - 1].kind == "op"
        and plan.steps[k].kind == "op"
        and plan.steps[k - 1].fuser == plan.steps[k].fuser
    ]
    candidates = inside or list(range(1, n))
    return min(candidates, key=lambda k: (abs(2 * k - n), k))


def split_points(plan: Plan) -> list[str]:
    """Step names a split can start part 2 at: every step but the first."""
    return [s.name for s in plan.steps[1:]]


def cut_at(plan: Plan, step_name: str | None) -> int:
    if step_name is None:
        return default_cut(plan)
    names = [s.name for s in plan.steps]
    choices = ", ".join(split_points(plan)) or "none"
    if step_name not in names:
        hint = did_you_mean(step_name, names)
        raise SplitError(
            f"no step {step_name!r} to split at; choose one of {choices}" + (f" ({hint})" if hint else "")
        )
    k = names.index(step_name)
    if k == 0:
        raise SplitError(
            f"step {step_name!r} is the first step: part 1 would be empty; choose one of {choices}"
        )
    return k


def split_plan(plan: Plan, cut: int | None = None) -> SplitPlan:
    """Steps ``[0, cut)`` become part 1, ``[cut, n)`` part 2; crossing channels are bridged."""
    k = default_cut(plan) if cut is None else cut
    if not 0 < k < len(plan.steps):
        raise SplitError(f"cut {k} is outside 1..{len(plan.steps) - 1}")
    model = plan_to_model(plan)
    ops1, ops2 = model["ops"][:k], model["ops"][k:]
    bridges: list[Bridge] = []
    # The channel graph says who feeds whom: a channel crosses the cut when a consumer is past it.
    for name, channel in plan.channels.items():
        crossing = [c for c in channel.consumers if c.step >= k]
        if channel.producer.step >= k or not crossing:
            continue
        producer = ops1[channel.producer.step]
        producer["extra_outputs"][channel.producer.slot_name]["public"] = True
        inputs = []
        for ref in crossing:
            consumer = ops2[ref.step - k]
            del consumer["extra_inputs"][ref.slot_name]  # unbound: a public input <step>_<slot>
            inputs.append(plan.steps[ref.step].public_input_name(ref.slot))
        bridges.append(Bridge(name, name, tuple(inputs)))
    width = plan.steps[k].in_width if plan.steps[k].in_width is not None else plan.steps[k - 1].out_width
    part1 = _validated({**model, "name": f"{plan.name}_part1", "ops": ops1})
    # Part 2 takes the main path as it is at the cut (token rows inside a FlattenTokens span).
    layout = plan.steps[k].layout or "any"
    part2 = _validated(
        {**model, "name": f"{plan.name}_part2", "in_features": width, "input_layout": layout, "ops": ops2}
    )
    return SplitPlan(plan, part1, part2, k, tuple(bridges))


def _validated(model: Mapping[str, Any]) -> Plan:
    from te_assembly.pipeline import load

    # The model alone: a part may end inside a tensor-parallel region, and the split variant runs in
    # one process (bench.compare is refused under torchrun), so no parallel section is checked.
    analysis = load(model, sections={})
    if analysis.plan is None:
        raise ConfigError(list(analysis.diagnostics), f"splitting produced an invalid {model['name']}")
    return analysis.plan


class SplitModel(torch.nn.Module):
    """Two models called one after the other, the bridged tensors passed by the caller in between.
    Called like the original: ``y, extras = model(x, **public_inputs)``."""

    def __init__(self, split: SplitPlan, part1: AssembledModel, part2: AssembledModel) -> None:
        super().__init__()
        self.split = split
        self.part1 = part1
        self.part2 = part2
        self._part1_inputs = [t.name for t in split.part1.public_inputs]
        self._part2_inputs = {t.name for t in split.part2.public_inputs}
        self._feeds = {name: b.output for b in split.bridges for name in b.inputs}
        self._outputs = [t.name for t in split.original.public_outputs]

    def load_from(self, model: torch.nn.Module) -> SplitModel:
        """Copy the weights of the unsplit model (parameters are named ``steps.<step>.*`` in both)."""
        full = model.state_dict()
        for part in (self.part1, self.part2):
            names = {s.name for s in part.plan.steps}
            part.load_state_dict({k: v for k, v in full.items() if k.split(".")[1] in names})
        return self

    def forward(self, x: torch.Tensor, **named: torch.Tensor) -> ModelOutput:
        y1, extras1 = self.part1(x, **{n: named[n] for n in self._part1_inputs})
        inputs2 = {n: extras1[self._feeds[n]] if n in self._feeds else named[n] for n in self._part2_inputs}
        y, extras2 = self.part2(y1, **inputs2)
        merged = {**extras1, **extras2}
        return ModelOutput(y, {n: merged[n] for n in self._outputs})
