"""The shape of a catalog entry. Pure data: importing this never imports torch or TE."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from te_assembly.catalog.costs import FREE, Cost
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
    default_from: str | None = None
    """A null (or missing) value takes this other argument's value (Attention's ``num_kv_heads``
    defaults to ``num_heads``)."""
    items: Any = None
    """For a ``list`` argument: the type of each item (LoRA's ``parts``: widths, ints)."""

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
        # ``type(None)`` among the types (``tensor_parallel_mode``) is a nullable field.
        kept = tuple(t for t in types if t is not type(None))
        if kept == (int,) and low is None and high is None:  # a count, nullable or not (num_kv_heads)
            low = 1
        nullable = len(kept) < len(types)
        choices = None if self.choices is None else tuple(c for c in self.choices if c is not None)
        kind: type | tuple[type, ...] = kept[0] if len(kept) == 1 else kept
        items = (
            None if self.items is None else FieldSpec(self.items, minimum=1 if self.items is int else None)
        )
        return FieldSpec(
            kind, self.default, self.doc, choices, minimum=low, maximum=high, nullable=nullable, items=items
        )


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
    width_arg: str | None = None
    """A ``main``-shaped slot whose width is this argument's, not the width of the main path arriving
    at the op (LoRA's ``x``: the input of the projection it adapts, ``in_features`` wide); an optional
    argument left null means the main path's (SwapExtraInput's ``value_features``)."""
    doc: str = ""
    shape: str = "main"
    """What the tensor looks like, so a channel can only join slots that agree:
    ``main`` (like the main-path tensor at that op), ``rows`` (one value per row of the main path),
    ``token_topk`` ([tokens, top_k]), ``groups`` (one per group/expert), ``scalar``."""
    is_loss: bool = False
    """A scalar loss term the caller should add to its objective (TopKRouter's aux_loss)."""
    ahead_arg: str | None = None
    """Logits of a multi-token prediction module: the argument saying how many tokens past the next one
    they predict (AheadLogits' ``depth``); the caller adds their cross-entropy, weighted, to its
    objective."""

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
        if self.ahead_arg is not None:
            parts.append(f"logits of the token {self.ahead_arg} past the next: the caller adds their loss")
        return "; ".join(parts)


SHAPES = {
    "main": "shaped like the main-path tensor at the op",
    "rows": "one value per row of the main path",
    "token_topk": "[tokens, top_k]",
    "groups": "one value per group (expert)",
    "scalar": "a scalar",
    "token_shape": "[ndim - 1]: the leading dimensions of a flattened tensor",
}
"""``Slot.shape`` in words."""


@dataclass(frozen=True)
class Formula:
    """A width computed from arguments, as data: ``text`` is an arithmetic expression of argument
    names, integers, ``+``, ``*`` and parentheses, e.g. ``(num_heads + 2*num_kv_heads) * head_dim``.
    The validator, the engines, ``explain`` and the docs all read the same expression."""

    text: str

    @cached_property
    def _tokens(self) -> tuple[str, ...]:
        return tuple(re.findall(r"[A-Za-z_]\w*|\d+|[()+*]", self.text))

    @cached_property
    def args(self) -> tuple[str, ...]:
        """The argument names it reads, in order of first use."""
        return tuple(dict.fromkeys(t for t in self._tokens if t[0].isalpha() or t[0] == "_"))

    def value(self, args: Mapping[str, Any]) -> int | None:
        """The width for ``args``; None while an argument it reads is not a positive int."""
        values = {}
        for name in self.args:
            v = args.get(name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                return None
            values[name] = v
        return _evaluate(self._tokens, values)

    def shown(self, args: Mapping[str, Any]) -> str:
        """``text`` with each argument's value in place of its name: ``(4 + 2*2) * 16``."""
        return re.sub(r"[A-Za-z_]\w*", lambda m: str(args.get(m.group(0), m.group(0))), self.text)


def _evaluate(tokens: tuple[str, ...], values: Mapping[str, int]) -> int:
    """``+``/``*`` with the usual precedence and parentheses (a tiny recursive-descent parser: no
    ``eval``, catalog formulas are data)."""
    position = 0

    def atom() -> int:
        nonlocal position
        token = tokens[position]
        position += 1
        if token == "(":
            result = sum_()
            position += 1  # the closing parenthesis
            return result
        return int(token) if token.isdigit() else values[token]

    def product() -> int:
        nonlocal position
        result = atom()
        while position < len(tokens) and tokens[position] == "*":
            position += 1
            result *= atom()
        return result

    def sum_() -> int:
        nonlocal position
        result = product()
        while position < len(tokens) and tokens[position] == "+":
            position += 1
            result += product()
        return result

    return sum_()


@dataclass(frozen=True)
class Width:
    """How an op changes the feature width of the main-path tensor."""

    in_arg: str | None = None
    """Argument that must equal the width arriving at the op."""
    out_arg: str | None = None
    """Argument giving the width leaving the op; otherwise ``in // divisor``."""
    divisor: int = 1
    """2 for gated (GLU) activations: the input is split in halves."""
    in_formula: Formula | None = None
    """Width the op takes, computed from its arguments (Attention's packed QKV width)."""
    out_formula: Formula | None = None
    """Width the op returns, computed from its arguments."""

    @property
    def checks_input(self) -> bool:
        return self.in_arg is not None or self.in_formula is not None

    def expected_in(self, args: Mapping[str, Any]) -> Any:
        """The width the op takes for ``args`` (None: any, or not computable from broken arguments)."""
        if self.in_arg is not None:
            return args.get(self.in_arg)
        if self.in_formula is not None:
            return self.in_formula.value(args)
        return None

    def declared_out(self, args: Mapping[str, Any]) -> int | None:
        """The width the arguments alone give the output, or None (it follows the input)."""
        if self.out_arg is not None:
            value = args.get(self.out_arg)
            return value if isinstance(value, int) and not isinstance(value, bool) else None
        if self.out_formula is not None:
            return self.out_formula.value(args)
        return None

    def out_width(self, in_width: int, args: Mapping[str, Any]) -> int:
        declared = self.declared_out(args) if self.out_arg is not None else None
        if declared is not None:  # an optional out_arg left null: the width follows the input
            return declared
        if self.out_formula is not None:
            value = self.out_formula.value(args)
            if value is not None:
                return value
        return in_width // self.divisor

    def describe_in(self) -> str | None:
        """How the docs and ``explain`` name the input width rule."""
        return self.in_arg or (self.in_formula.text if self.in_formula else None)

    def describe_out(self) -> str | None:
        return self.out_arg or (self.out_formula.text if self.out_formula else None)

    def describe(self) -> str:
        """The rule in words (``ls op NAME``, docs)."""
        rule_in = self.describe_in()
        arriving = f"the width arriving must equal {rule_in}" if rule_in else ""
        rule_out = self.describe_out()
        if rule_out is not None:
            leaving = f"the width leaving is {rule_out}"
        elif self.divisor != 1:
            leaving = f"the width leaving is the width arriving / {self.divisor} (gated: two halves)"
        else:
            leaving = "the width leaving is the width arriving"
        return "; ".join(part for part in (arriving, leaving) if part)


LAYOUTS: dict[str, str] = {
    "any": "[..., features]",
    "tokens": "[tokens, features]",
    "sequence": "[batch, seq, features]",
    "restored": "[*token_shape, features]",
    "token_ids": "[batch, seq] token ids (int64)",
}
"""How the main-path tensor is laid out. ``any``: whatever ``x`` is (the ops work on the last dim);
``tokens``: 2-D rows (Dispatch and Combine move rows); ``sequence``: 3-D (Attention mixes positions);
``restored``: after a RestoreTokens whose token_shape the caller passes (any leading dims);
``token_ids``: a language model's input, integer ids below its ``in_features`` (the vocabulary size),
which only an ``Embedding`` takes. All but ``restored`` are what a model's ``input_layout`` may declare."""

INPUT_LAYOUTS = ("any", "tokens", "sequence", "token_ids")
"""The layouts a model's ``input_layout`` may declare."""
SEQUENCE_LAYOUTS = ("sequence", "token_ids")
"""Input layouts made of whole sequences: ``x`` is cut into ``[batch, seq]`` by each job's ``seq_len``."""


@dataclass(frozen=True)
class MultipleOf:
    """``args[arg]`` must be a multiple of ``of`` (an argument name or a number), when ``when`` (a bool
    argument) is true or None."""

    arg: str
    of: str | int
    why: str
    when: str | None = None


class _Arguments:
    """What an op and a module do with their ``params``: look one up, fill defaults (a null derived
    argument takes another's value, ``default_from``)."""

    params: tuple[Param, ...]

    @cached_property
    def params_by_name(self) -> dict[str, Param]:
        return {p.name: p for p in self.params}

    @cached_property
    def defaults(self) -> dict[str, Any]:
        """The arguments that have a default, with it."""
        return {p.name: p.default for p in self.params if not p.required}

    def param(self, name: str) -> Param | None:
        return self.params_by_name.get(name)

    def with_defaults(self, args: Mapping[str, Any]) -> dict[str, Any]:
        full = {**self.defaults, **args}
        for p in self.derived_params:
            if full.get(p.name) is None:
                full[p.name] = full.get(p.default_from)  # type: ignore[arg-type]
        return full

    @cached_property
    def derived_params(self) -> tuple[Param, ...]:
        """Params whose null value takes another argument's (``default_from``)."""
        return tuple(p for p in self.params if p.default_from is not None)


@dataclass(frozen=True)
class OpSpec(_Arguments):
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
    buffers: tuple[str, ...] = ()
    """Names in ``param_shapes`` that are buffers (saved, loaded, never trained; not counted as
    parameters): TopKRouter's ``expert_bias``."""
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
    multiples: tuple[MultipleOf, ...] = ()
    """Arguments that must be multiples of another argument or a number."""
    arg_checks: Callable[[Mapping[str, Any]], list[tuple[str, str, str | None]]] = lambda args: []
    """Rules across arguments that ``arg_rules`` and ``multiples`` cannot say, as (argument, message,
    hint) per problem, given the arguments with their defaults (LoRA's ``parts`` summing to
    ``out_features``)."""
    needs_layout: str | None = None
    """The main-path layout (``LAYOUTS``) the op needs: ``tokens`` for Dispatch and Combine."""
    sets_layout: str | None = None
    """The layout the op leaves: ``tokens`` (FlattenTokens), or ``token_shape``: the layout recorded by
    the FlattenTokens whose ``token_shape`` channel feeds it (RestoreTokens)."""
    tie_param: str | None = None
    """The parameter a step's ``tie_weight`` may share with another step's (a vocabulary head's weight
    with the embedding's), by its name in ``param_shapes``; None: this op's weights cannot be tied."""
    tie_required: str | None = None
    """A boolean argument that, when true, makes ``tie_weight`` required: the op then reads another
    step's weight as its ``tie_param`` (DoRA reads the adapted projection's)."""
    cost: Cost = FREE
    """Its forward FLOPs and what it keeps for backward (``costs.py``): what ``bench`` and the memory
    estimate count for it."""
    token_wise: bool = False
    """Each row of its output is computed from the same row of its inputs alone (norms, linears,
    activations, adapters; randomness aside): a language model's last steps, when all are, run over
    chunks of tokens where a loss asks for it (``analysis/head.py``). False for anything that mixes
    rows (attention, routing, token shifts) or moves them."""

    @property
    def changes_rows(self) -> bool:
        return self.rows_delta != 0

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

    def basic_ops(self, args: Mapping[str, Any]) -> tuple[tuple[str, dict[str, Any]], ...]:
        if self.expands_to is None:
            return ((self.name, dict(args)),)
        return self.expands_to(args)


@dataclass(frozen=True)
class ModuleSpec(_Arguments):
    """A non-fusible torch module from the allowlist. It ends a fuser, as in ``te.ops.Sequential``."""

    name: str
    doc: str
    torch_class: str
    """``module:Class`` the reference engine builds (and the TE engine, unless ``te_class`` applies).
    ``torch.nn`` classes, or te_assembly's own reference modules (Attention)."""
    params: tuple[Param, ...] = ()
    width: Width = field(default_factory=Width)
    param_shapes: Callable[[Mapping[str, Any]], dict[str, tuple[int, ...]]] = lambda args: {}
    te_class: str | None = None
    """``module:Class`` the TE engine builds with ``kernels=te`` (TE's own kernels); None: ``torch_class``."""
    te_runs_on_cpu: bool = True
    """False when ``te_class`` needs a CUDA GPU (TE's attention)."""
    te_lacks: tuple[tuple[str, str], ...] = ()
    """(argument, what it asks for) that ``te_class`` has no kernel for: a step that sets one (not null
    or false) runs ``torch_class`` in the TE engine too, and the fusion report says why."""
    arg_rules: tuple[tuple[str, str, str], ...] = ()
    """As ``OpSpec.arg_rules``."""
    multiples: tuple[MultipleOf, ...] = ()
    """As ``OpSpec.multiples``."""
    needs_layout: str | None = None
    """The main-path layout the module needs (``sequence`` for Attention)."""
    sets_layout: str | None = None
    """As ``OpSpec.sets_layout`` (``sequence`` for Embedding: token ids in, ``[batch, seq, dim]`` out)."""
    tie_param: str | None = None
    """As ``OpSpec.tie_param``."""
    cost: Cost = FREE
    """As ``OpSpec.cost``."""
    token_wise: bool = False
    """As ``OpSpec.token_wise``."""

    def te_missing(self, args: Mapping[str, Any]) -> list[str]:
        """What of ``args`` ``te_class`` has no kernel for (``te_lacks``), in words."""
        return [what for name, what in self.te_lacks if args.get(name) not in (None, False)]

    def te_path(self, args: Mapping[str, Any], kernels: str) -> str | None:
        """``te_class`` where the TE engine builds it for ``args`` under ``kernels``; None: ``torch_class``
        (``kernels=reference``, no TE class, or a twist TE has no kernel for)."""
        if kernels != "te" or self.te_class is None or self.te_missing(args):
            return None
        return self.te_class
