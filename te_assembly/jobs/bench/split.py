"""Cut a plan into parts, the way blocks were written before TE's channels: every channel that
crosses a cut becomes a public output of its producer's part and a public input of each later part
that reads it (one per consumer). A model whose channels are rerouted across modules is cut after each
module they cross: the same model written by hand as separate fusers with public tensors.

The cut works on the model mapping rebuilt from the plan and re-validates both halves, so each part is
an ordinary, checked plan that any engine builds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from te_assembly.analysis.plan import Plan
from te_assembly.diagnostics import did_you_mean
from te_assembly.engines.base import AssembledModel, ModelOutput, share_parameter
from te_assembly.errors import ConfigError, SplitError


@dataclass(frozen=True)
class Bridge:
    """A channel crossing a cut: returned by the producer's part as ``output``, fed to later parts as
    ``inputs`` (one per consumer; public input names are unique across parts)."""

    channel: str
    output: str
    inputs: tuple[str, ...]


@dataclass(frozen=True)
class SplitPlan:
    original: Plan
    parts: tuple[Plan, ...]
    cuts: tuple[int, ...]
    """Index of the first step of each part after the first, ascending."""
    bridges: tuple[Bridge, ...]

    @property
    def part1(self) -> Plan:
        return self.parts[0]

    @property
    def part2(self) -> Plan:
        return self.parts[1]

    @property
    def cut(self) -> int:
        """The first cut (the only one when the split has two parts)."""
        return self.cuts[0]


def plan_to_model(plan: Plan) -> dict[str, Any]:
    """The model mapping that validates to ``plan`` (args with defaults filled in)."""
    ops: list[dict[str, Any]] = []
    for s in plan.steps:
        entry: dict[str, Any] = {"name": s.name, s.kind: s.type, "args": dict(s.args)}
        if s.tie_weight is not None:
            entry["tie_weight"] = s.tie_weight  # kept where both steps land in one part (``split``)
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


def reroute_cuts(plan: Plan) -> list[int]:
    """The cuts that write a rerouted model by hand: one after every module a rerouted channel crosses,
    so no part has a channel consumed past its own fuser (each such channel becomes a public output of
    one part and a public input of a later one, as before TE's channels)."""
    return sorted({m + 1 for r in plan.reroutes for m in r.crosses if m + 1 < len(plan.steps)})


def compare_cuts(plan: Plan, split_at: str | None = None) -> list[int]:
    """Where ``bench.compare``'s variant (b) cuts: at every fuser boundary a rerouted channel crosses,
    and at ``split_at`` (left out: the midpoint of a fuser, when there are no such boundaries)."""
    cuts = set(reroute_cuts(plan))
    if split_at is not None or not cuts:
        cuts.add(cut_at(plan, split_at))
    return sorted(cuts)


def split_plan(plan: Plan, cut: int | Sequence[int] | None = None) -> SplitPlan:
    """Steps ``[0, cut)`` become part 1, ``[cut, n)`` part 2 (several cuts: several parts); channels
    that cross a cut are bridged."""
    cuts = [default_cut(plan)] if cut is None else [cut] if isinstance(cut, int) else sorted(set(cut))
    if not cuts:
        raise SplitError("no cut given")
    for k in cuts:
        if not 0 < k < len(plan.steps):
            raise SplitError(f"cut {k} is outside 1..{len(plan.steps) - 1}")
    model = plan_to_model(plan)
    bounds = [0, *cuts, len(plan.steps)]
    part_of = {i: p for p in range(len(bounds) - 1) for i in range(bounds[p], bounds[p + 1])}
    ops = model["ops"]  # plan_to_model made fresh dicts: edited in place below
    bridges: list[Bridge] = []
    # The channel graph says who feeds whom: a channel is bridged when a consumer is in a later part.
    for name, channel in plan.channels.items():
        home = part_of[channel.producer.step]
        crossing = [c for c in channel.consumers if part_of[c.step] != home]
        if not crossing:
            continue
        ops[channel.producer.step]["extra_outputs"][channel.producer.slot_name]["public"] = True
        inputs = []
        for ref in crossing:
            del ops[ref.step]["extra_inputs"][ref.slot_name]  # unbound: a public input <step>_<slot>
            inputs.append(plan.steps[ref.step].public_input_name(ref.slot))
        bridges.append(Bridge(name, name, tuple(inputs)))
    for step in plan.steps:  # a tie across the cut: SplitModel shares the Parameter between the parts
        if step.tie_weight is not None and part_of[plan.step(step.tie_weight).index] != part_of[step.index]:
            del ops[step.index]["tie_weight"]
    parts = []
    for p in range(len(bounds) - 1):
        first, end = bounds[p], bounds[p + 1]
        entry: dict[str, Any] = {**model, "name": f"{plan.name}_part{p + 1}", "ops": ops[first:end]}
        if first > 0:
            step, before = plan.steps[first], plan.steps[first - 1]
            entry["in_features"] = step.in_width if step.in_width is not None else before.out_width
            # A later part takes the main path as it is there (token rows inside a FlattenTokens span).
            entry["input_layout"] = step.layout or "any"
        parts.append(_validated(entry))
    return SplitPlan(plan, tuple(parts), tuple(cuts), tuple(bridges))


def _validated(model: Mapping[str, Any]) -> Plan:
    from te_assembly.analysis.pipeline import load

    # The model alone: a part may end inside a tensor-parallel region, and the split variant runs in
    # one process (bench.compare is refused under torchrun), so no parallel section is checked.
    analysis = load(model, sections={})
    if analysis.plan is None:
        raise ConfigError(list(analysis.diagnostics), f"splitting produced an invalid {model['name']}")
    return analysis.plan


class SplitModel(torch.nn.Module):
    """Its parts called one after the other, the bridged tensors passed by the caller in between.
    Called like the original: ``y, extras = model(x, **public_inputs)``."""

    def __init__(self, split: SplitPlan, *parts: AssembledModel) -> None:
        super().__init__()
        if len(parts) != len(split.parts):
            raise ValueError(f"{len(split.parts)} parts planned, {len(parts)} given")
        self.split = split
        self.parts = torch.nn.ModuleList(parts)
        self._share_ties_across_parts(parts)
        self._inputs = [[t.name for t in p.public_inputs] for p in split.parts]
        self._feeds = {name: b.output for b in split.bridges for name in b.inputs}
        self._outputs = [t.name for t in split.original.public_outputs]

    def _share_ties_across_parts(self, parts: tuple[AssembledModel, ...]) -> None:
        """A weight tied across the cut is one Parameter in both parts, as in the unsplit model. TE's
        fusers list a part's parameters when they are built, so TE parts cannot share one afterwards."""
        where = {s.name: part for part in parts for s in part.plan.steps}
        for step in self.split.original.steps:
            if step.tie_weight is None:
                continue
            mine, theirs = where[step.name], where[step.tie_weight]
            if mine is theirs:
                continue
            if mine.engine != "reference":
                raise SplitError(
                    f"step {step.name!r} is tied to {step.tie_weight!r} across the cut: the split variant "
                    "of a tied model runs with engine=reference only (TE's fusers hold each part's own "
                    "parameters)"
                )
            owner = self.split.original.step(step.tie_weight)
            shared = theirs.steps.get_parameter(f"{owner.name}.{owner.spec.tie_param}")
            share_parameter(mine.steps, f"{step.name}.{step.spec.tie_param}", shared)

    def load_from(self, model: torch.nn.Module) -> SplitModel:
        """Copy the weights of the unsplit model (parameters are named ``steps.<step>.*`` in all)."""
        full = model.state_dict()
        plan = getattr(model, "plan", None)
        for alias, owner in (plan.tied_params if plan is not None else {}).items():
            full[alias] = full[owner]  # a tie across the cut: each part holds its own copy
        for part in self.parts:
            part.load_state_dict({k: full[k] for k in part.state_dict()})
        return self

    def forward(self, x: torch.Tensor, **named: torch.Tensor) -> ModelOutput:
        produced: dict[str, torch.Tensor] = {}
        for part, inputs in zip(self.parts, self._inputs, strict=True):
            fed = {n: produced[self._feeds[n]] if n in self._feeds else named[n] for n in inputs}
            x, extras = part(x, **fed)
            produced.update(extras)
        return ModelOutput(x, {n: produced[n] for n in self._outputs})
