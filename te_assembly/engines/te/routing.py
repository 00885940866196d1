"""What each TE fuser takes and returns, as data: the caller's public tensors and the rerouted channels.
Pure Python: no torch, no TE.

TE's channels live inside one ``OperationFuser``. A channel consumed in a later fuser (``plan.Reroute``)
is carried across by the engine: its producer's slot is also returned by its fuser
(``output_to_caller=True``, see ``bindings.py``) into a register, and each later consumer's slot is left
unbound, so it is a public input of that fuser, fed from the register. Autograd adds the gradients that
flow back through those inputs to the output's gradient, which TE sums with the gradients of the
consumers inside the producer's fuser: the same sum one fuser would compute. The caller's inputs and
outputs are the plan's, in the plan's order.
"""

from __future__ import annotations

from dataclasses import dataclass

from te_assembly.analysis.plan import Plan


@dataclass(frozen=True)
class FuserIO:
    """The public extra inputs and outputs of one fuser, in TE's (basic-op index, slot) order."""

    fuser: int
    inputs: tuple[int, ...]
    """Where each input comes from: ``i >= 0`` the caller's public input ``i``; ``-1 - r`` register ``r``."""
    outputs: tuple[tuple[int, int], ...]
    """Where each output goes: (the caller's public output index or -1, register or -1)."""

    @property
    def plain(self) -> bool:
        """Only the caller's tensors, in one contiguous run each (the fast path)."""
        return all(i >= 0 for i in self.inputs) and all(r < 0 and c >= 0 for c, r in self.outputs)


def fuser_io(plan: Plan) -> list[FuserIO]:
    """One ``FuserIO`` per fuser of ``plan``, in fuser order; ``len`` of the registers is the number of
    rerouted channels (``plan.reroutes``; register ``r`` holds ``plan.reroutes[r]``)."""
    register = {r.channel: n for n, r in enumerate(plan.reroutes)}
    producer_fuser = {r.channel: r.producer_fuser for r in plan.reroutes}
    caller_in = {(t.ref.step, t.ref.slot): i for i, t in enumerate(plan.public_inputs)}
    caller_out = {(t.ref.step, t.ref.slot): i for i, t in enumerate(plan.public_outputs)}
    out = []
    for group in plan.fusers:
        inputs: list[int] = []
        outputs: list[tuple[int, int]] = []
        for index in group.steps:
            step = plan.steps_by_index[index]
            for slot, channel in enumerate(step.input_channels):
                if channel is None:
                    inputs.append(caller_in[(index, slot)])
                elif channel in register and producer_fuser[channel] != group.index:
                    inputs.append(-1 - register[channel])
            for slot, channel in enumerate(step.output_channels):
                to_caller = caller_out.get((index, slot), -1)
                to_register = register.get(channel, -1) if channel is not None else -1
                if to_caller >= 0 or to_register >= 0:
                    outputs.append((to_caller, to_register))
        out.append(FuserIO(group.index, tuple(inputs), tuple(outputs)))
    return out


def rerouted_input_slots(plan: Plan) -> set[tuple[int, int]]:
    """(step, slot) of every consumer slot read across a fuser boundary: left unbound in TE."""
    return {(ref.step, ref.slot) for r in plan.reroutes for ref in r.consumers}


__all__ = ["FuserIO", "fuser_io", "rerouted_input_slots"]
