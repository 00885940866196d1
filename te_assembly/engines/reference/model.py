"""The reference engine: the plan run step by step in plain PyTorch, with TE's channel semantics.

Channels are passed as the very tensor object their producer returned, so autograd sums the gradient
of every consumer (and the caller's, for a public channel) into the producer, as TE's fuser does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from te_assembly.analysis.plan import Plan, PlannedStep
from te_assembly.catalog import ModuleSpec, OpSpec, load_object
from te_assembly.engines.base import AssembledModel, add_step, step_module, tie_weights

if TYPE_CHECKING:
    from te_assembly.engines.parallel.context import ParallelContext


@dataclass(frozen=True)
class _Instruction:
    """One step, compiled at build time so a forward does no name lookups."""

    module: torch.nn.Module
    is_op: bool
    inputs: tuple[int, ...]
    """Register holding each extra input slot's tensor."""
    outputs: tuple[int, ...]
    """Register each extra output slot is stored in; outputs nobody reads share a scratch register."""
    channels: tuple[tuple[str, int], ...]
    """(channel name, output slot) of each channel this step produces, for ``record_channels``."""


class ReferenceModel(AssembledModel):
    """A plan as plain PyTorch modules: catalog reference ops and allowlisted torch modules."""

    engine = "reference"

    def __init__(
        self, plan: Plan, device: torch.device, dtype: torch.dtype, parallel: ParallelContext | None = None
    ) -> None:
        super().__init__(plan)
        for step in plan.steps:
            split = parallel.reference_module(step, device, dtype) if parallel is not None else None
            add_step(self.steps, step.name, split if split is not None else _instantiate(step, device, dtype))
        tie_weights(self.steps, plan)
        self._program, self._num_registers, self._input_registers, self._output_registers = _compile(
            plan, self.steps
        )
        self._recording = False
        self.channel_tensors: dict[str, torch.Tensor] = {}
        """With ``record_channels()``: each channel's tensor from the last forward (float ones retain
        their gradient after backward: the sum over all consumers, plus the caller's if public)."""

    def record_channels(self, enabled: bool = True) -> ReferenceModel:
        """Opt in to keeping every channel tensor of the next forwards in ``channel_tensors``.

        Each float channel that requires grad is replaced by a view of itself that retains its
        gradient, so ``channel_tensors[name].grad`` is exactly d loss / d channel, summed over its
        consumers (and the caller), separate from the main path the producer also feeds."""
        self._recording = enabled
        if not enabled:
            self.channel_tensors = {}
        return self

    def channel_grads(self) -> dict[str, torch.Tensor | None]:
        """The gradient that reached each recorded channel in the last backward (None: no gradient)."""
        return {name: t.grad if t.is_floating_point() else None for name, t in self.channel_tensors.items()}

    def _forward_positional(
        self, x: torch.Tensor, *extra_inputs: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        registers: list[torch.Tensor | None] = [None] * self._num_registers
        for register, value in zip(self._input_registers, extra_inputs, strict=True):
            registers[register] = value
        recording = self._recording
        if recording:
            self.channel_tensors = {}
        for ins in self._program:
            if not ins.is_op:
                x = ins.module(x)
                continue
            x, extra = ins.module(x, [registers[i] for i in ins.inputs])
            for register, value in zip(ins.outputs, extra, strict=True):
                registers[register] = value
            if recording and ins.channels:
                self._record(ins, registers)
        if not self._output_registers:
            return x
        return (x, *(registers[i] for i in self._output_registers))  # type: ignore[misc,arg-type]

    def _record(self, ins: _Instruction, registers: list[torch.Tensor | None]) -> None:
        for name, slot in ins.channels:
            register = ins.outputs[slot]
            tensor = registers[register]
            assert tensor is not None
            if tensor.requires_grad:
                # A distinct autograd node, so .grad holds only what the channel's consumers and the
                # caller send back, not the main-path gradient of a producer that returns x itself.
                tensor = tensor.view_as(tensor)
                tensor.retain_grad()
                registers[register] = tensor
            self.channel_tensors[name] = tensor


def _instantiate(step: PlannedStep, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    spec = step.spec
    if isinstance(spec, OpSpec):
        cls = load_object(spec.reference)
        return cls(**step.args, device=device, dtype=dtype)
    assert isinstance(spec, ModuleSpec)
    # The class comes from the allowlist entry, never from the config.
    module: torch.nn.Module = load_object(spec.torch_class)(**step.args)
    return module.to(device=device, dtype=dtype)


def _compile(
    plan: Plan, modules: torch.nn.ModuleDict
) -> tuple[list[_Instruction], int, tuple[int, ...], tuple[int, ...]]:
    """Give every tensor that travels outside the main path a register: each public input, each output
    slot that is public or feeds a channel. A channel's consumers read its producer's register."""
    slot_register: dict[tuple[int, int], int] = {}
    count = 0
    for step in plan.steps:
        for slot, (channel, public) in enumerate(zip(step.output_channels, step.output_public, strict=True)):
            if public or (channel is not None and plan.channels[channel].consumers):
                slot_register[(step.index, slot)] = count
                count += 1
    public_in: dict[tuple[int, int], int] = {}
    for tensor in plan.public_inputs:
        public_in[(tensor.ref.step, tensor.ref.slot)] = count
        count += 1
    producer_register = {
        name: slot_register[(c.producer.step, c.producer.slot)]
        for name, c in plan.channels.items()
        if (c.producer.step, c.producer.slot) in slot_register
    }
    scratch = count
    count += 1
    program = []
    for step in plan.steps:
        inputs = tuple(
            producer_register[channel] if channel is not None else public_in[(step.index, slot)]
            for slot, channel in enumerate(step.input_channels)
        )
        outputs = tuple(
            slot_register.get((step.index, slot), scratch) for slot in range(len(step.output_slots))
        )
        channels = tuple((name, slot) for slot, name in enumerate(step.output_channels) if name is not None)
        program.append(
            _Instruction(step_module(modules, step.name), step.kind == "op", inputs, outputs, channels)
        )
    returned = tuple(slot_register[(t.ref.step, t.ref.slot)] for t in plan.public_outputs)
    return program, count, tuple(public_in.values()), returned


def build_reference(
    plan: Plan,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    parallel: ParallelContext | None = None,
) -> ReferenceModel:
    """The plan as a ``ReferenceModel``. Initialisation draws from torch's global RNG: seed it with
    ``torch.manual_seed`` before building for reproducible weights. ``parallel``: build this rank's
    split ops (``engines/parallel/``); their weights are then loaded by ``parallel.build``."""
    return ReferenceModel(plan, torch.device(device), dtype, parallel)


__all__ = ["ReferenceModel", "add_step", "build_reference"]
