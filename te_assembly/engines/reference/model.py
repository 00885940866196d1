"""The reference engine: the plan run step by step in plain PyTorch, with TE's channel semantics.

Channels are passed as the very tensor object their producer returned, so autograd sums the gradient
of every consumer (and the caller's, for a public channel) into the producer, as TE's fuser does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from te_assembly.analysis.plan import Plan, PlannedStep
from te_assembly.catalog import ModuleSpec, OpSpec, load_object
from te_assembly.engines.base import (
    AssembledModel,
    BlockScope,
    add_step,
    block_use_scopes,
    check_checkpointing,
    checkpointed,
    step_module,
    tie_weights,
)
from te_assembly.engines.head_chunks import reduced_in_chunks
from te_assembly.errors import ArgumentError

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
        units = block_use_scopes(plan)
        split_steps = set()
        for step in plan.steps:
            split = parallel.reference_module(step, device, dtype) if parallel is not None else None
            module = split if split is not None else _instantiate(step, device, dtype)
            add_step(self.steps, step.name, module, units)
            if split is not None:
                split_steps.add(step.index)
        tie_weights(self.steps, plan)
        self._program, self._num_registers, self._input_registers, self._output_registers = _compile(
            plan, self.steps
        )
        head = plan.head
        if head is not None and any(index >= head for index in split_steps):
            head = None
        self._head = head
        """Where the head the logits are reduced through begins (``engines/head_chunks.py``); None: the
        plan has none, or a tensor-parallel split of it gathers across ranks."""
        self._tail = _Unit(self._program[head:], (), (), False) if head is not None else None
        self._body: tuple[_Segment, ...] = ()
        """What runs before the head inside ``reducing``: the flat program up to it as one segment, or
        (``configure``) the units before it."""
        if head is not None:
            ins, reads, writes = self._program[:head], self._input_registers, self._output_registers
            self._body = (_Segment("", None, ins, reads, writes, _Unit(ins, reads, writes, False)),)
        self._flat_body = self._body
        self._recording = False
        self._segments: tuple[_Segment, ...] = ()
        self.channel_tensors: dict[str, torch.Tensor] = {}
        """With ``record_channels()``: each channel's tensor from the last forward (float ones retain
        their gradient after backward: the sum over all consumers, plus the caller's if public)."""

    def configure(
        self, *, activation_checkpointing: str = "none", compile: bool = False, sharded: bool = False
    ) -> None:
        """Run the program as units: each block use one (a ``BlockScope`` called as a module, so FSDP2's
        hooks see it), the steps between them another, a model without blocks one in all. ``blocks``
        recomputes each block use in backward (a model without blocks: the whole forward), ``all`` every
        step; ``compile`` compiles each unit. The default (nothing asked) keeps the flat program."""
        check_checkpointing(activation_checkpointing)
        self.configured = {"activation_checkpointing": activation_checkpointing, "compile": compile}
        self.__dict__.pop("_forward_positional", None)
        self._segments, self._body = (), self._flat_body
        if activation_checkpointing == "none" and not compile and not sharded:
            return
        if self._recording:
            raise ArgumentError(_FLAT_ONLY)
        if compile:
            _import_quietly_without_cuda()
        segments = _segments(self.plan, self._program, self._output_registers, self.steps, self._head)
        has_blocks = any(seg.scope is not None for seg in segments)
        for seg in segments:
            whole = activation_checkpointing == "blocks" and (seg.scope is not None or not has_blocks)
            run: Callable[..., tuple[torch.Tensor, ...]] = _Unit(
                seg.instructions, seg.reads, seg.writes, activation_checkpointing == "all"
            )
            if compile:
                run = torch.compile(run)
            if whole:
                run = functools.partial(checkpointed, run)
            if seg.scope is not None:
                seg.scope.runner = run
            seg.call = seg.scope if seg.scope is not None else run
        self._segments = tuple(segments)
        if self._head is not None:
            self._body = tuple(seg for seg in segments if not seg.head)
        self.__dict__["_forward_positional"] = self._forward_units

    @property
    def runs_as_units(self) -> bool:
        return bool(self._segments)

    def shard_units(self) -> list[torch.nn.Module]:
        # A tied weight must belong to one FSDP2 unit: a block use holding one is sharded with the rest.
        tied = {name.removeprefix("steps.") for pair in self.plan.tied_params.items() for name in pair}
        units: list[torch.nn.Module] = []
        for seg in self._segments:
            if seg.scope is None:
                continue
            prefix = seg.name + "."
            if not any(name.startswith(prefix) for name in tied):
                units.append(seg.scope)
        return units

    def _forward_units(
        self, x: torch.Tensor, *extra_inputs: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        x, registers = self._run_segments(self._segments, x, extra_inputs)
        return self._returned(x, registers)

    def _run_segments(
        self, segments: tuple[_Segment, ...], x: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """``segments`` in order from the caller's tensors: ``x`` after them, and every register."""
        registers: list[torch.Tensor | None] = [None] * self._num_registers
        for register, value in zip(self._input_registers, extra_inputs, strict=True):
            registers[register] = value
        for seg in segments:
            assert seg.call is not None
            x, *written = seg.call(x, *(registers[i] for i in seg.reads))
            for register, value in zip(seg.writes, written, strict=True):
                registers[register] = value
        return x, registers

    def _returned(
        self, y: torch.Tensor, registers: list[torch.Tensor | None]
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if not self._output_registers:
            return y
        return (y, *(registers[i] for i in self._output_registers))  # type: ignore[misc,arg-type]

    def _forward_reduced(
        self, x: torch.Tensor, *extra_inputs: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The steps before the head (as units when configured), then the head chunk by chunk."""
        if self._tail is None or self._recording:
            return super()._forward_reduced(x, *extra_inputs)
        assert self._reduction is not None
        x, registers = self._run_segments(self._body, x, extra_inputs)
        modules = [ins.module for ins in self._tail.program]
        return self._returned(reduced_in_chunks(x, self._run_tail, self._reduction, modules), registers)

    def _run_tail(self, x: torch.Tensor) -> torch.Tensor:
        assert self._tail is not None
        return self._tail(x)[0]

    def record_channels(self, enabled: bool = True) -> ReferenceModel:
        """Opt in to keeping every channel tensor of the next forwards in ``channel_tensors``.

        Each float channel that requires grad is replaced by a view of itself that retains its
        gradient, so ``channel_tensors[name].grad`` is exactly d loss / d channel, summed over its
        consumers (and the caller), separate from the main path the producer also feeds."""
        if enabled and self._segments:
            raise ArgumentError(_FLAT_ONLY)
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


_FLAT_ONLY = "record_channels() needs the flat program: configure the model without options"


def _import_quietly_without_cuda() -> None:
    """Import ``torch.utils.cpp_extension`` (inductor does, at the first compiled call) with its "No CUDA
    runtime is found" warning held back: on a machine without a GPU it says nothing the run's first
    line did not (device cpu), and it says it once per process, mid progress bar."""
    import importlib
    import logging

    if torch.cuda.is_available():
        return
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        importlib.import_module("torch.utils.cpp_extension")
    finally:
        logger.setLevel(level)


class _Unit:
    """A run of instructions as one callable: ``x`` and the registers it reads from outside in, ``x``
    and the registers later units (or the caller) read out. ``per_step``: each step recomputed in
    backward (``activation_checkpointing=all``)."""

    def __init__(
        self, program: list[_Instruction], reads: tuple[int, ...], writes: tuple[int, ...], per_step: bool
    ) -> None:
        self.program, self.reads, self.writes, self.per_step = program, reads, writes, per_step

    def __call__(self, x: torch.Tensor, *values: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        registers: dict[int, torch.Tensor | None] = dict(zip(self.reads, values, strict=True))
        for ins in self.program:
            if not ins.is_op:
                x = checkpointed(ins.module, x) if self.per_step else ins.module(x)
                continue
            inputs = [registers[i] for i in ins.inputs]
            x, extra = checkpointed(ins.module, x, inputs) if self.per_step else ins.module(x, inputs)
            for register, value in zip(ins.outputs, extra, strict=True):
                registers[register] = value
        return (x, *(registers[r] for r in self.writes))  # type: ignore[arg-type]


@dataclass
class _Segment:
    """Consecutive steps run as one unit: a block use's (``scope``, its ``BlockScope``) or the steps
    between block uses."""

    name: str
    scope: BlockScope | None
    instructions: list[_Instruction]
    reads: tuple[int, ...] = ()
    writes: tuple[int, ...] = ()
    call: Callable[..., tuple[torch.Tensor, ...]] | None = None
    head: bool = False
    """Part of the head (``engines/head_chunks.py``)."""


def _segments(
    plan: Plan,
    program: list[_Instruction],
    returned: tuple[int, ...],
    steps: torch.nn.Module,
    head: int | None,
) -> list[_Segment]:
    """The program cut at block-use boundaries and where the head begins, with the registers each piece
    reads from before it and writes for after it (or for the caller)."""
    scope_of: dict[int, str] = {}
    for group in plan.blocks:
        for use in group.uses:
            for index in use.steps:
                scope_of[index] = f"{group.name}.{use.index}"
    segments: list[_Segment] = []
    for step, ins in zip(plan.steps, program, strict=True):
        name = scope_of.get(step.index, "")
        if not segments or segments[-1].name != name or step.index == head:
            scope = step_module(steps, name) if name else None
            in_head = head is not None and step.index >= head
            segments.append(
                _Segment(name, scope if isinstance(scope, BlockScope) else None, [], head=in_head)
            )
        segments[-1].instructions.append(ins)
    later_reads: set[int] = set(returned)
    for seg in reversed(segments):
        written = {r for ins in seg.instructions for r in ins.outputs}
        read = {r for ins in seg.instructions for r in ins.inputs}
        seg.writes = tuple(sorted(written & later_reads))
        seg.reads = tuple(sorted(read - written))
        later_reads |= read
    return segments


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
