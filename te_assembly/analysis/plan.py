"""The validated plan: what every engine, ``explain`` and ``graph`` build from.

A plan is only made from a config with no errors, so engines never re-check the graph. Everything here
is frozen: each validation pass returns new steps (``analyze.py`` runs them in order), and
what a plan derives (``steps_by_index``, ``producer_of``) is computed once and kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from te_assembly.catalog import (
    ADAPTER_TYPES,
    MODULE_ALLOWLIST,
    OPS,
    SEQUENCE_LAYOUTS,
    ModuleSpec,
    OpSpec,
    Slot,
)
from te_assembly.config.block_uses import BlockGroup, BlockUse  # noqa: F401  (part of the plan's vocabulary)
from te_assembly.diagnostics import Diagnostic


@dataclass(frozen=True)
class SlotRef:
    step: int
    slot: int
    """TE slot index (enabled slots only, in catalog order)."""
    slot_name: str


@dataclass(frozen=True)
class PlannedStep:
    index: int
    name: str
    kind: str
    """``op`` (fusible, from the catalog) or ``module`` (allowlisted torch module)."""
    type: str
    args: dict[str, Any]
    """Constructor arguments with catalog defaults filled in."""
    fuser: int | None = None
    first_basic_op: int = 0
    """Fuser-local index of this step's first TE basic op (what TE's messages count)."""
    input_slots: tuple[Slot, ...] = ()
    output_slots: tuple[Slot, ...] = ()
    input_channels: tuple[str | None, ...] = ()
    output_channels: tuple[str | None, ...] = ()
    output_public: tuple[bool, ...] = ()
    in_width: int | None = None
    out_width: int | None = None
    row_depth: int | None = None
    """Dispatch depth of the main path arriving here: 0 = token rows, 1 = dispatched expert rows."""
    layout: str | None = None
    """Layout of the main path arriving here (``catalog.LAYOUTS``: ``any``, ``tokens``, ``sequence``)."""
    args_valid: bool = True
    """False while the step has argument errors (validation only; never in a finished plan)."""
    tie_weight: str | None = None
    """The step whose weight (``spec.tie_param``) this step's is, or None (``analysis/ties.py``)."""

    @property
    def spec(self) -> OpSpec | ModuleSpec:
        return OPS[self.type] if self.kind == "op" else MODULE_ALLOWLIST[self.type]

    @property
    def basic_ops(self) -> tuple[tuple[str, dict[str, Any]], ...]:
        spec = self.spec
        return spec.basic_ops(self.args) if isinstance(spec, OpSpec) else ()

    @property
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return self.spec.param_shapes(self.args)

    @property
    def num_params(self) -> int:
        """Parameters this step owns: a tied weight is counted at the step it is tied to."""
        shapes = self.param_shapes
        tied = self.spec.tie_param if self.tie_weight is not None else None
        buffers = getattr(self.spec, "buffers", ())
        return sum(math.prod(s) for name, s in shapes.items() if name != tied and name not in buffers)

    def evolve(self, **changes: Any) -> PlannedStep:
        """A copy with ``changes`` (what a later pass computed: fuser, widths). Cheaper than
        ``dataclasses.replace``, which re-runs ``__init__``; ``self`` is left as it is."""
        new = object.__new__(PlannedStep)
        new.__dict__.update(self.__dict__, **changes)
        return new

    def slot_width(self, slot: Slot) -> int | None:
        """The feature width of a ``main``-shaped slot's tensor: the main path's arriving here, or the
        argument the slot names (LoRA's ``x``: ``in_features``)."""
        value = self.args.get(slot.width_arg) if slot.width_arg is not None else None
        if value is None:  # no such argument, or an optional one left null: the main path's width
            return self.in_width
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def public_input_name(self, slot: int) -> str:
        return f"{self.name}_{self.input_slots[slot].name}"

    def public_output_name(self, slot: int) -> str:
        return self.output_channels[slot] or f"{self.name}_{self.output_slots[slot].name}"


@dataclass(frozen=True)
class Channel:
    name: str
    dtype: str
    fuser: int
    producer: SlotRef
    consumers: tuple[SlotRef, ...]
    public: bool


@dataclass(frozen=True)
class Reroute:
    """A channel consumed in a later fuser than its producer's (non-fusible modules sit between them).

    TE's channels live inside one ``OperationFuser``, so the TE engine returns the producer's output from
    its fuser as well (``output_to_caller=True``; consumers in that fuser keep their binding) and passes
    it to each later consumer's fuser as a public input of that fuser; autograd then adds the gradients
    of the later consumers to the one the producer's fuser computes for its own, exactly as inside one
    fuser. The model's own call signature does not change. Computed once by the validator."""

    channel: str
    producer_fuser: int
    consumer_fusers: tuple[int, ...]
    """The later fusers that read it, in order."""
    consumers: tuple[SlotRef, ...]
    """The consumer slots outside the producer's fuser (TE: unbound, public inputs of their fusers)."""
    crosses: tuple[int, ...]
    """Indices of the module steps between the producer and its last consumer."""


@dataclass(frozen=True)
class PublicTensor:
    name: str
    ref: SlotRef
    dtype: str
    fuser: int


@dataclass(frozen=True)
class FuserGroup:
    index: int
    steps: tuple[int, ...]
    num_basic_ops: int
    ended_by: int | None
    """Index of the module step that ends this fuser, if any."""


@dataclass(frozen=True)
class Plan:
    name: str
    in_features: int
    out_features: int
    steps: list[PlannedStep]
    fusers: list[FuserGroup]
    channels: dict[str, Channel]
    public_inputs: list[PublicTensor]
    """In TE's calling order: (basic-op index, slot), fuser after fuser."""
    public_outputs: list[PublicTensor]
    """In TE's return order."""
    dims: dict[str, Any] = field(default_factory=dict)
    warnings: list[Diagnostic] = field(default_factory=list)
    input_layout: str = "any"
    """What ``x`` must look like: ``any`` ``[..., features]``, ``tokens`` ``[tokens, features]`` or
    ``sequence`` ``[batch, seq, features]`` (``layouts.py``)."""
    input_layout_source: str = ""
    """Why, for messages: ``from input_layout: sequence`` or the step that needs it."""
    reroutes: tuple[Reroute, ...] = ()
    """Channels consumed in later fusers than their producer's (see ``Reroute``), in channel order."""
    blocks: tuple[BlockGroup, ...] = ()
    """The model's block steps, in model order (their steps are in ``steps``, expanded)."""
    head: int | None = None
    """The index of the first step of a language model's head, the steps it ends with that run over
    chunks of tokens when a loss asks (``head.py``); None: none can."""

    @property
    def num_params(self) -> int:
        return sum(s.num_params for s in self.steps)

    @property
    def takes_token_ids(self) -> bool:
        """A language model: ``x`` is ``[batch, seq]`` int64 token ids below ``in_features``."""
        return self.input_layout == "token_ids"

    @property
    def takes_sequences(self) -> bool:
        """``x`` is whole sequences (``[batch, seq, features]`` or token ids): jobs cut it by ``seq_len``."""
        return self.input_layout in SEQUENCE_LAYOUTS

    @cached_property
    def adapter_params(self) -> frozenset[str]:
        """The adapters' parameters by name (``steps.layers.0.qkv_lora.lora_A0``). A plan with any is a
        frozen base with adapters: only these train, and a checkpoint holds only these."""
        tied = self.tied_params  # DoRA's view of the projection's weight is the projection's
        return frozenset(
            f"steps.{step.name}.{name}"
            for step in self.steps
            if step.type in ADAPTER_TYPES
            for name in step.param_shapes
            if f"steps.{step.name}.{name}" not in tied
        )

    @property
    def num_trainable_params(self) -> int:
        """Parameters an optimizer updates: the adapters' when there are any, else every one."""
        adapters = [s for s in self.steps if s.type in ADAPTER_TYPES]
        return sum(s.num_params for s in adapters) if adapters else self.num_params

    @cached_property
    def tied_params(self) -> dict[str, str]:
        """Each tied parameter's name -> the name of the parameter it is (``steps.head.basic_ops.0.weight``
        -> ``steps.embed.weight``): one Parameter, stored once, under the second name."""
        out = {}
        for step in self.steps:
            if step.tie_weight is not None:
                owner = self.step(step.tie_weight)
                out[f"steps.{step.name}.{step.spec.tie_param}"] = f"steps.{owner.name}.{owner.spec.tie_param}"
        return out

    @cached_property
    def steps_by_index(self) -> dict[int, PlannedStep]:
        return {s.index: s for s in self.steps}

    @cached_property
    def _by_name(self) -> dict[str, PlannedStep]:
        return {s.name: s for s in self.steps}

    @cached_property
    def _feeds(self) -> dict[tuple[int, int], SlotRef]:
        return {(ref.step, ref.slot): c.producer for c in self.channels.values() for ref in c.consumers}

    def step(self, name: str) -> PlannedStep:
        found = self._by_name.get(name)
        if found is None:
            raise KeyError(f"{self.name} has no step {name!r}")
        return found

    def producer_of(self, step: int, slot: int) -> SlotRef | None:
        """The output slot that feeds extra input ``slot`` of step ``step`` through a channel, or None
        for a public input."""
        return self._feeds.get((step, slot))
