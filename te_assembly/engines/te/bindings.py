"""The channel setter calls the TE engine makes, as data. Pure Python: no torch, no TE.

Every call happens between constructing an op and constructing its ``OperationFuser``: TE locks an
op's bindings when a fuser (even the transient one of a direct ``op(x)`` call) captures them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from te_assembly.analysis.plan import Plan
from te_assembly.catalog import MODULE_ALLOWLIST, OPS

SET_INPUT = "set_extra_input_channel"
SET_OUTPUT = "set_extra_output_channel"


@dataclass(frozen=True)
class BindingCall:
    """``steps[step].<method>(slot_index, channel[, output_to_caller=...])``."""

    step: str
    method: str
    slot_index: int
    channel: str
    output_to_caller: bool | None = None
    """Only for ``set_extra_output_channel``; None for inputs."""

    def apply(self, op: Any) -> None:
        """Make the call on a TE ``BasicOperation`` (or anything with TE's setters)."""
        if self.method == SET_INPUT:
            op.set_extra_input_channel(self.slot_index, self.channel)
        else:
            assert self.output_to_caller is not None
            op.set_extra_output_channel(self.slot_index, self.channel, output_to_caller=self.output_to_caller)


def binding_calls(plan: Plan) -> list[BindingCall]:
    """The setter calls for ``plan``, step by step in plan order, inputs before outputs, slots in TE
    order. Unbound slots need no call: TE's default is a public input or output.

    A rerouted channel (``plan.reroutes``, see ``routing.py``) is also returned by its producer's fuser
    (``output_to_caller=True`` whatever the config says about the caller), and its consumers in later
    fusers stay unbound: the engine feeds them as public inputs of their fusers."""
    from te_assembly.engines.te.routing import rerouted_input_slots

    across = rerouted_input_slots(plan)
    rerouted = {r.channel for r in plan.reroutes}
    calls: list[BindingCall] = []
    for step in plan.steps:
        if step.kind != "op":
            continue
        for slot, channel in enumerate(step.input_channels):
            if channel is not None and (step.index, slot) not in across:
                calls.append(BindingCall(step.name, SET_INPUT, slot, channel))
        for slot, channel in enumerate(step.output_channels):
            if channel is not None:
                public = step.output_public[slot] or channel in rerouted
                calls.append(BindingCall(step.name, SET_OUTPUT, slot, channel, public))
    return calls


def gpu_only_steps(plan: Plan, kernels: str) -> list[str]:
    """Steps whose TE kernel needs a GPU under ``kernels`` (``"name (Type)"``). Our own ops (no
    ``te_class``) always run through the reference adapter, torch modules run anywhere, and a module
    with a TE class (attention) needs the GPU unless the catalog says otherwise."""
    if kernels != "te":
        return []
    out = []
    for step in plan.steps:
        if step.kind == "module":
            module = MODULE_ALLOWLIST[step.type]
            if module.te_path(step.args, kernels) is not None and not module.te_runs_on_cpu:
                out.append(f"{step.name} ({step.type})")
            continue
        spec = OPS[step.type]
        if spec.te_class is not None and not spec.te_runs_on_cpu:
            out.append(f"{step.name} ({step.type})")
    return out
