"""The same math as plain PyTorch: the reference op modules called in a straight line, no channels.

For comparison only. ``PlainModel`` generates, from the plan, the forward a person would write by hand
(one local variable per tensor, one call per step, no registers, lists or name lookups at run time)
and runs the reference engine's op modules with it. So with ``engine=reference`` (a) and (c) differ
only by the channel bookkeeping; with ``engine=te`` (c) is the reference math, not TE's kernels.
"""

from __future__ import annotations

from typing import Any

import torch

from te_assembly.analysis.plan import Plan
from te_assembly.engines.base import ModelOutput, step_module, store_ties_once
from te_assembly.engines.reference.model import build_reference


def plain_source(plan: Plan) -> str:
    """Python source of ``forward(self, x, <public inputs>)`` for ``plan``."""
    local: dict[tuple[int, int], str] = {}
    for n, channel in enumerate(plan.channels.values()):
        local[(channel.producer.step, channel.producer.slot)] = f"c{n}"
    public_in = {(t.ref.step, t.ref.slot): f"i{n}" for n, t in enumerate(plan.public_inputs)}
    for n, t in enumerate(plan.public_outputs):
        local.setdefault((t.ref.step, t.ref.slot), f"o{n}")
    args = "".join(f", {v}" for v in public_in.values())
    lines = [f"def forward(self, x{args}):"]
    for s in plan.steps:
        call = f"self.ops[{s.index}]"
        if s.kind == "module":
            lines.append(f"    x = {call}(x)  # {s.name}")
            continue
        ins = [
            public_in.get((s.index, i)) or local[_producer(plan, s.index, i)]
            for i in range(len(s.input_slots))
        ]
        outs = [local.get((s.index, i), "_") for i in range(len(s.output_slots))]
        target = f"x, ({', '.join(outs)},)" if outs else "x, _"
        lines.append(f"    {target} = {call}(x, ({''.join(v + ', ' for v in ins)}))  # {s.name}")
    returned = [local[(t.ref.step, t.ref.slot)] for t in plan.public_outputs]
    lines.append(f"    return x, ({''.join(v + ', ' for v in returned)})")
    return "\n".join(lines) + "\n"


def _producer(plan: Plan, step: int, slot: int) -> tuple[int, int]:
    ref = plan.producer_of(step, slot)
    assert ref is not None, "a bound input slot always has a producer in a plan"
    return ref.step, ref.slot


class PlainModel(torch.nn.Module):
    """``y, extras = model(x, **public_inputs)``, computed by the generated straight-line forward."""

    def __init__(
        self, plan: Plan, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
    ) -> None:
        super().__init__()
        self.plan = plan
        # The reference engine's op modules, registered under the same ``steps.<name>`` names.
        self.steps = build_reference(plan, device=device, dtype=dtype).steps  # tied weights stay tied
        store_ties_once(self, plan)
        self.ops = [step_module(self.steps, s.name) for s in plan.steps]
        self.source = plain_source(plan)
        namespace: dict[str, Any] = {}
        exec(compile(self.source, f"<plain forward of {plan.name}>", "exec"), namespace)
        self._forward = namespace["forward"]
        self._inputs = [t.name for t in plan.public_inputs]
        self._outputs = [t.name for t in plan.public_outputs]

    def forward(self, x: torch.Tensor, **named: torch.Tensor) -> ModelOutput:
        y, extras = self._forward(self, x, *(named[n] for n in self._inputs))
        return ModelOutput(y, dict(zip(self._outputs, extras, strict=True)))
