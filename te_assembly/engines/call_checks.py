"""What a model checks about every call, derived once from the plan at build time.

A call's tensors must fit the plan before any op sees them: torch broadcasting would otherwise turn a
public addend of the wrong shape into a ``y`` of a new shape without a word, and a wrong feature width
fails deep inside an op with a message about matrices nobody wrote. The rules are computed at build
time, so a call costs a few shape comparisons.

Shapes follow the catalog's slot shapes (``catalog/spec.py``): ``main`` is the main-path tensor at that
step (``[*rows, width]``), ``rows`` one value per row of it, ``token_topk`` ``[tokens, top_k]``,
``groups`` one value per group, ``scalar`` a 0-d tensor. Rows after a ``Dispatch`` are ``tokens * top_k``.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from dataclasses import dataclass
from fractions import Fraction

import torch

from te_assembly.analysis.plan import Plan
from te_assembly.catalog import OpSpec
from te_assembly.errors import CallError, InputShapeError


@dataclass(frozen=True)
class InputRule:
    """What one public input must look like, relative to ``x``."""

    name: str
    where: str
    """``step.slot`` with the op type, for messages."""
    is_int: bool
    kind: str
    width: int | None
    """Feature width of the main path at the step (``main`` slots)."""
    count: int | None
    """``top_k`` (``token_topk``) or the number of groups (``groups``)."""
    row_factor: Fraction | None
    """Rows at the step = tokens * row_factor (Dispatch multiplies by top_k, Combine divides); None when
    the count depends on the data (a Dispatch that pads each expert group to an alignment)."""
    local: bool = False
    """A rank of a parallel layout: rows and groups are its own, so only the layout of the shape (its
    number of dims and the feature width) is checked."""
    flat: bool = False
    """The main path is token rows at the step (after a FlattenTokens): ``x``'s leading dims flattened."""
    free_lead: bool = False
    """The main path has whatever leading dims a public token_shape gave it (after a RestoreTokens fed
    by the caller): any leading dims holding the same number of rows."""

    def accepts(self, shape: tuple[int, ...], lead: tuple[int, ...]) -> bool:
        """Whether a tensor of ``shape`` fits for an ``x`` of shape ``(*lead, features)``."""
        if self.free_lead and self.kind in ("main", "rows") and not self.local:
            main = self.kind == "main"
            kept = shape[:-1] if main else shape
            width_ok = not main or shape[-1:] == (self.width or 0,)
            # row_factor None: the rows depend on the routing (an aligned Dispatch), any count fits
            rows_ok = self.row_factor is None or math.prod(kept) == math.prod(lead) * self.row_factor
            if shape and width_ok and rows_ok:
                return True
        return fits(shape, self.shapes(lead))

    def shapes(self, lead: tuple[int, ...]) -> tuple[tuple[int | None, ...], ...]:
        """Accepted shapes for an ``x`` of shape ``(*lead, features)``, the first the one to name; a None
        dimension is any size."""
        if self.kind == "token_shape":
            return ((None,),)  # the leading dimensions of some tensor: their number is the caller's
        if self.flat:
            lead = (math.prod(lead),)
        rows: tuple[int | None, ...] = lead
        if self.local or self.row_factor is None:
            rows = (None,) * len(lead) if self.local else (None,)
        elif self.row_factor != 1:
            rows = (int(math.prod(lead) * self.row_factor),)
        if self.kind == "main":
            return ((*rows, self.width or 0),)
        if self.kind == "rows":
            if None in rows:
                return (rows, (None,))
            flat = (math.prod(r for r in rows if r is not None),)
            return (rows,) if rows == flat else (rows, flat)
        if self.kind == "token_topk":
            return ((*rows, self.count or 0),)
        if self.kind == "groups":
            return ((None,),) if self.local else ((self.count or 0,),)
        return ((), (1,))  # scalar


def fits(shape: tuple[int, ...], accepted: tuple[tuple[int | None, ...], ...]) -> bool:
    return any(
        len(shape) == len(want) and all(w is None or w == s for s, w in zip(shape, want, strict=True))
        for want in accepted
    )


_COUNT_ROLE = {"token_topk": "top_k", "groups": "groups"}
"""The slot shape's second dimension (or only one) is the argument that plays this ``agree`` role."""


def _count(kind: str, slot_agree: tuple[tuple[str, str], ...], args: dict[str, object]) -> int | None:
    wanted = _COUNT_ROLE.get(kind)
    for role, arg in slot_agree:
        value = args.get(arg)
        if role == wanted and isinstance(value, int):
            return value
    return None


def input_rules(plan: Plan) -> tuple[InputRule, ...]:
    """One rule per public input, in the plan's calling order."""
    factor: dict[int, Fraction | None] = {}
    current: Fraction | None = Fraction(1)
    before_dispatch: list[Fraction | None] = []
    for step in plan.steps:
        factor[step.index] = current
        spec = step.spec
        if isinstance(spec, OpSpec) and spec.rows_delta > 0:
            before_dispatch.append(current)
            padded = int(step.args.get("align", 1)) > 1  # how many rows then depends on the routing
            current = None if current is None or padded else current * int(step.args.get("top_k", 1))
        elif isinstance(spec, OpSpec) and spec.rows_delta < 0:
            # Combine folds the rows its Dispatch made (dropping any padding). Without that Dispatch in
            # this plan (x arrives as dispatched rows) the padding, and so the count, is unknown.
            current = before_dispatch.pop() if before_dispatch else None
    by_index = {s.index: s for s in plan.steps}
    rules = []
    for tensor in plan.public_inputs:
        step = by_index[tensor.ref.step]
        slot = step.input_slots[tensor.ref.slot]
        rules.append(
            InputRule(
                name=tensor.name,
                where=f"{step.name}.{slot.name} ({step.type})",
                is_int=slot.dtype == "int",
                kind=slot.shape,
                width=step.slot_width(slot),
                count=_count(slot.shape, slot.agree, step.args),
                row_factor=factor[step.index],
                flat=step.layout == "tokens",
                free_lead=step.layout == "restored",
            )
        )
    return tuple(rules)


_INT_DTYPES = frozenset(
    {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64}
)
_FLOAT_DTYPES = frozenset(
    d for d in vars(torch).values() if isinstance(d, torch.dtype) and d.is_floating_point
)


def _show(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("*" if d is None else str(d) for d in shape) + "]"


_SIGNATURE = operator.attrgetter("shape", "dtype", "device")


def _kind_ok(t: torch.Tensor, is_int: bool) -> bool:
    return t.dtype in (_INT_DTYPES if is_int else _FLOAT_DTYPES)


class CallChecks:
    """The checks of one model, precomputed; ``check(x, inputs)`` raises ``CallError`` (a non-tensor)
    or ``InputShapeError``.

    It runs on every call, next to TE's own per-call work, so the common case is a few comparisons
    (measured by ``bench/te_overhead.py``): the expected shapes of the public inputs are recomputed
    only when ``x``'s shape or dtype changes, and messages are built only on failure.
    """

    def __init__(self, plan: Plan, row_changing_steps: tuple[str, ...]) -> None:
        self.name = plan.name
        self.in_features = plan.in_features
        self.row_changing_steps = row_changing_steps
        self.input_layout = plan.input_layout
        self.input_layout_source = plan.input_layout_source
        self.rules = input_rules(plan)
        self._x_key: tuple[torch.Size, torch.dtype] | None = None
        """Shape and dtype of the last ``x`` that passed; ``_expected`` holds the inputs' shapes for it."""
        self._expected: tuple[tuple[tuple[int | None, ...], ...], ...] = ()
        self._dtypes = tuple(_INT_DTYPES if rule.is_int else _FLOAT_DTYPES for rule in self.rules)
        self._accepted: object = None
        """The signature (shapes, dtypes, devices) of the last call that passed every check."""

    def check(self, x: torch.Tensor, inputs: tuple[torch.Tensor, ...]) -> None:
        if self.input_layout == "token_ids":
            self._check_ids(x)  # values, not only the shape: every call
        try:
            # The usual call repeats the last one's shapes, dtypes and devices: one tuple comparison,
            # its parts read by C-level attrgetters.
            key = (
                (x.shape, x.dtype, x.device, tuple(map(_SIGNATURE, inputs))) if inputs else (x.shape, x.dtype)
            )
            if key == self._accepted:
                return
        except AttributeError:  # something that is not a tensor
            key = None
        self._check_fully(x, inputs)
        self._accepted = key

    def _check_fully(self, x: torch.Tensor, inputs: tuple[torch.Tensor, ...]) -> None:
        try:
            if (x.shape, x.dtype) != self._x_key:
                self._learn(x)
            if not inputs:
                return
            cuda = x.is_cuda
            for t, shapes, dtypes in zip(inputs, self._expected, self._dtypes, strict=True):
                if (t.shape == shapes[0] or t.shape in shapes) and t.dtype in dtypes and t.is_cuda == cuda:
                    continue
                self._bad_inputs(x, inputs)
        except (AttributeError, TypeError):  # something that is not a tensor
            if not isinstance(x, torch.Tensor):
                raise CallError(f"{self.name}: x must be a torch.Tensor, got {type(x).__name__}") from None
            self._bad_inputs(x, inputs)
            raise

    def local_rows(self) -> None:
        """For a rank of a parallel layout: its inputs hold its own rows (and expert groups), so their
        shapes are checked for layout and feature width only."""
        self.rules = tuple(dataclasses.replace(rule, local=True) for rule in self.rules)
        self._x_key = self._accepted = None

    def _lead(self, x: torch.Tensor) -> tuple[int, ...]:
        """``x``'s leading dimensions: all of token ids' (they have no feature dimension)."""
        return tuple(x.shape) if self.input_layout == "token_ids" else tuple(x.shape[:-1])

    def _check_ids(self, x: torch.Tensor) -> None:
        """Token ids: an integer ``[batch, seq]`` tensor, every id in ``[0, in_features)``; an id out of range
        would be an index error deep inside the embedding (or a device assert on a GPU)."""
        if not isinstance(x, torch.Tensor):
            raise CallError(f"{self.name}: x must be a torch.Tensor of token ids, got {type(x).__name__}")
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise InputShapeError(
                f"{self.name} takes x as integer token ids [batch, seq] ({self.input_layout_source}); got a "
                f"{x.dtype} tensor"
            )
        if x.dim() != 2:
            raise InputShapeError(
                f"{self.name} takes x as token ids of shape [batch, seq] ({self.input_layout_source}); got "
                f"shape {tuple(x.shape)}"
            )
        if x.numel() == 0:
            return
        low, high = torch.stack(torch.aminmax(x)).tolist()  # one device sync per call, not two
        if low < 0 or high >= self.in_features:
            bad = low if low < 0 else high
            where = (x == bad).nonzero()[0].tolist()
            raise InputShapeError(
                f"{self.name}: token id {bad} at x{where} is outside its vocabulary of {self.in_features} "
                f"(ids 0..{self.in_features - 1}): was the text tokenized with another tokenizer?"
            )

    def _learn(self, x: torch.Tensor) -> None:
        self.check_x(x)
        lead = self._lead(x)
        # Exact shapes compare fast as torch.Size; a shape with free dims never equals one, so an input
        # it describes takes the slow path (``fits``) once per new signature.
        self._expected = tuple(
            tuple(torch.Size(s) if None not in s else s for s in rule.shapes(lead))  # type: ignore[arg-type,misc]
            for rule in self.rules
        )
        self._x_key = (x.shape, x.dtype)

    def _bad_x_type(self, x: object) -> None:
        if not isinstance(x, torch.Tensor):
            raise CallError(f"{self.name}: x must be a torch.Tensor, got {type(x).__name__}")
        raise InputShapeError(f"{self.name}: x must be a floating-point tensor, got {x.dtype}")

    def check_x(self, x: torch.Tensor) -> None:
        """``x`` alone: a floating-point tensor of shape [..., in_features], 2-D or 3-D when the plan's
        ``input_layout`` is ``tokens`` or ``sequence``; token ids as ``_check_ids`` says."""
        if self.input_layout == "token_ids":
            self._check_ids(x)
            return
        if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
            self._bad_x_type(x)
        shape = x.shape
        if not shape or shape[-1] != self.in_features:
            raise InputShapeError(
                f"{self.name} takes x of shape [..., {self.in_features}] (in_features={self.in_features}); "
                f"got shape {tuple(shape)}"
            )
        if self.input_layout == "tokens" and len(shape) != 2:
            raise InputShapeError(
                f"{self.name} takes x as a 2-D [tokens, features] tensor ({self.input_layout_source}); got "
                f"shape {tuple(shape)}: pass x.reshape(-1, {self.in_features}) and reshape y back, or put "
                "FlattenTokens / RestoreTokens steps around the steps that need token rows"
            )
        if self.input_layout == "sequence" and len(shape) != 3:
            raise InputShapeError(
                f"{self.name} takes x as a 3-D [batch, seq, features] tensor ({self.input_layout_source}); "
                f"got shape {tuple(shape)}"
            )

    def _bad_inputs(self, x: torch.Tensor, inputs: tuple[torch.Tensor, ...]) -> None:
        """Raise for the first public input that does not fit (the slow path, with the message)."""
        lead = self._lead(x)
        for rule, t in zip(self.rules, inputs, strict=True):
            if not isinstance(t, torch.Tensor):
                raise CallError(
                    f"{self.name}: public input {rule.name!r} must be a torch.Tensor, got {type(t).__name__}"
                )
            shapes = rule.shapes(lead)
            if not rule.accepts(tuple(t.shape), lead):
                raise InputShapeError(
                    f"{self.name}: public input {rule.name!r} ({rule.where}) must have shape "
                    f"{_show(shapes[0])} for x of shape {list(x.shape)}; got {list(t.shape)}"
                )
            if not _kind_ok(t, rule.is_int):
                wanted = "an integer" if rule.is_int else "a floating-point"
                raise InputShapeError(
                    f"{self.name}: public input {rule.name!r} ({rule.where}) must be {wanted} tensor, "
                    f"got {t.dtype}"
                )
            if t.device != x.device:
                raise InputShapeError(
                    f"{self.name}: public input {rule.name!r} is on {t.device}, x on {x.device}: pass both "
                    "on the model's device"
                )
