"""The shape of a catalog entry. Pure data: importing this never imports torch or TE."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from te_assembly.fields import REQUIRED, FieldSpec


@dataclass(frozen=True)
class Param:
    """One constructor argument as the YAML spells it."""

    name: str
    type: type | tuple[type, ...]
    default: Any = REQUIRED
    choices: tuple[Any, ...] | None = None
    doc: str = ""
    bounds: tuple[float | None, float | None] = (None, None)
    """Inclusive (min, max) for numbers; None = unbounded. Ints are positive unless bounds say otherwise."""

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def type_name(self) -> str:
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        return " | ".join("None" if t is type(None) else t.__name__ for t in types)

    @cached_property
    def spec(self) -> FieldSpec:
        """The argument as a field spec, checked like every other config value (``fields.py``); floats
        must be finite, and ints positive unless ``bounds`` say otherwise."""
        low, high = self.bounds
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        if types == (int,) and low is None and high is None:
            low = 1
        # ``type(None)`` among the types (``tensor_parallel_mode``) is a nullable field.
        kept = tuple(t for t in types if t is not type(None))
        nullable = len(kept) < len(types)
        choices = None if self.choices is None else tuple(c for c in self.choices if c is not None)
        kind: type | tuple[type, ...] = kept[0] if len(kept) == 1 else kept
        return FieldSpec(kind, self.default, self.doc, choices, minimum=low, maximum=high, nullable=nullable)


@dataclass(frozen=True)
class Slot:
    """An extra input or output slot, in TE's slot order."""

    name: str
    dtype: str = "float"
    """``float`` tensors carry gradients; ``int`` tensors (split sizes, maps) do not."""
    agree: tuple[tuple[str, str], ...] = ()
    """(role, argument) pairs that must agree across a channel between producer and consumer,
    e.g. ``("groups", "num_experts")`` on a producer and ``("groups", "num_groups")`` on a consumer."""
    enabled_if: tuple[str, ...] = ()
    """The slot exists only when all these bool arguments are true (TE sizes slots at init)."""
    doc: str = ""
    shape: str = "main"
    """What the tensor looks like, so a channel can only join slots that agree:
    ``main`` (like the main-path tensor at that op), ``rows`` (one value per row of the main path),
    ``token_topk`` ([tokens, top_k]), ``groups`` (one per group/expert), ``scalar``."""
    is_loss: bool = False
    """A scalar loss term the caller should add to its objective (TopKRouter's aux_loss)."""

    def enabled(self, args: Mapping[str, Any]) -> bool:
        return all(bool(args.get(a)) for a in self.enabled_if)

    def describe(self) -> str:
        """What the slot carries, in words (``ls op NAME``, docs)."""
        parts = [f"{self.dtype} tensor, {SHAPES.get(self.shape, self.shape)}"]
        if self.agree:
            parts.append(
                "must agree across its channel: " + ", ".join(f"{arg} ({role})" for role, arg in self.agree)
            )
        if self.enabled_if:
            parts.append(f"only when {' and '.join(self.enabled_if)} are true")
        if self.is_loss:
            parts.append("a loss term: the caller adds it to the objective")
        return "; ".join(parts)


SHAPES = {
    "main": "shaped like the main-path tensor at the op",
    "rows": "one value per row of the main path",
    "token_topk": "[tokens, top_k]",
    "groups": "one value per group (expert)",
    "scalar": "a scalar",
}
"""``Slot.shape`` in words."""


@dataclass(frozen=True)
class Width:
    """How an op changes the feature width of the main-path tensor."""

    in_arg: str | None = None
    """Argument that must equal the width arriving at the op."""
    out_arg: str | None = None
    """Argument giving the width leaving the op; otherwise ``in // divisor``."""
    divisor: int = 1
    """2 for gated (GLU) activations: the input is split in halves."""

    def out_width(self, in_width: int, args: Mapping[str, Any]) -> int:
        if self.out_arg is not None:
            return int(args[self.out_arg])
        return in_width // self.divisor

    def describe(self) -> str:
        """The rule in words (``ls op NAME``, docs)."""
        arriving = f"the width arriving must equal {self.in_arg}" if self.in_arg else ""
        if self.out_arg is not None:
            leaving = f"the width leaving is {self.out_arg}"
        elif self.divisor != 1:
            leaving = f"the width leaving is the width arriving / {self.divisor} (gated: two halves)"
        else:
            leaving = "the width leaving is the width arriving"
        return "; ".join(part for part in (arriving, leaving) if part)


@dataclass(frozen=True)
class OpSpec:
    """One fusible op: the single description that validator, engines, explain and docs read."""

    name: str
    doc: str
    params: tuple[Param, ...] = ()
    inputs: tuple[Slot, ...] = ()
    outputs: tuple[Slot, ...] = ()
    width: Width = field(default_factory=Width)
    te_class: str | None = None
    """``module:Class`` of TE's op; None for our own ops (the TE engine adapts the reference)."""
    reference: str = ""
    """``module:Class`` of the pure-PyTorch implementation."""
    expands_to: Callable[[Mapping[str, Any]], tuple[tuple[str, dict[str, Any]], ...]] | None = None
    """For TE fused ops (``Linear``): the basic ops and their args, as TE builds them."""
    param_shapes: Callable[[Mapping[str, Any]], dict[str, tuple[int, ...]]] = lambda args: {}
    """Parameter names and shapes, exactly as TE's module names them."""
    te_runs_on_cpu: bool = False
    """TE's own kernel for this op runs without a GPU."""
    in_place_arg: bool = False
    """Has an ``in_place`` argument whose aliasing matters at channel endpoints."""
    validation_only_params: tuple[str, ...] = ()
    """Params checked by the validator but not passed to the TE constructor."""
    rows_delta: int = 0
    """+1 when the op fans rows out (Dispatch: each token becomes top_k expert rows), -1 when it folds
    them back (Combine). Such models take ``x`` as a 2-D [tokens, features] tensor, and a channel must
    join slots at the same depth (token rows vs dispatched rows)."""
    arg_rules: tuple[tuple[str, str, str], ...] = ()
    """(smaller, larger, message) pairs of arguments that must satisfy ``args[smaller] <= args[larger]``."""

    @property
    def changes_rows(self) -> bool:
        return self.rows_delta != 0

    @cached_property
    def params_by_name(self) -> dict[str, Param]:
        return {p.name: p for p in self.params}

    @cached_property
    def defaults(self) -> dict[str, Any]:
        """The arguments that have a default, with it."""
        return {p.name: p.default for p in self.params if not p.required}

    def param(self, name: str) -> Param | None:
        return self.params_by_name.get(name)

    def input_slots(self, args: Mapping[str, Any]) -> tuple[Slot, ...]:
        if not any(s.enabled_if for s in self.inputs):
            return self.inputs  # the common case: no slot depends on an argument
        full = self.with_defaults(args)
        return tuple(s for s in self.inputs if s.enabled(full))

    def output_slots(self, args: Mapping[str, Any]) -> tuple[Slot, ...]:
        if not any(s.enabled_if for s in self.outputs):
            return self.outputs
        full = self.with_defaults(args)
        return tuple(s for s in self.outputs if s.enabled(full))

    def with_defaults(self, args: Mapping[str, Any]) -> dict[str, Any]:
        return {**self.defaults, **args}

    def basic_ops(self, args: Mapping[str, Any]) -> tuple[tuple[str, dict[str, Any]], ...]:
        if self.expands_to is None:
            return ((self.name, dict(args)),)
        return self.expands_to(args)


@dataclass(frozen=True)
class ModuleSpec:
    """A non-fusible torch module from the allowlist. It ends a fuser, as in ``te.ops.Sequential``."""

    name: str
    doc: str
    torch_class: str
    params: tuple[Param, ...] = ()
    width: Width = field(default_factory=Width)
    param_shapes: Callable[[Mapping[str, Any]], dict[str, tuple[int, ...]]] = lambda args: {}

    @cached_property
    def params_by_name(self) -> dict[str, Param]:
        return {p.name: p for p in self.params}

    @cached_property
    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params if not p.required}

    def param(self, name: str) -> Param | None:
        return self.params_by_name.get(name)

    def with_defaults(self, args: Mapping[str, Any]) -> dict[str, Any]:
        return {**self.defaults, **args}
