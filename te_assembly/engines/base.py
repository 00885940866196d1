"""What every engine's model looks like to its caller: one call API, one parameter naming."""

from __future__ import annotations

import contextlib
import functools
import operator
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from te_assembly import display
from te_assembly.analysis.plan import Plan, PlannedStep
from te_assembly.catalog import OpSpec, Slot
from te_assembly.diagnostics import did_you_mean
from te_assembly.engines.call_checks import CallChecks, CallError, InputShapeError
from te_assembly.engines.head_chunks import TokenReduction, reduce_whole_logits
from te_assembly.engines.recompute import checkpointed
from te_assembly.errors import ArgumentError


def _public_output_slots(plan: Plan) -> Iterator[tuple[str, PlannedStep, Slot]]:
    """Each public output's name, the step that makes it and its slot in the catalog."""
    steps = {s.index: s for s in plan.steps}
    for tensor in plan.public_outputs:
        step = steps[tensor.ref.step]
        yield tensor.name, step, step.output_slots[tensor.ref.slot]


def loss_output_names(plan: Plan) -> tuple[str, ...]:
    """Public outputs that are loss terms (a slot with ``is_loss``, e.g. TopKRouter's aux_loss), whatever
    channel name the config gives them: the caller adds each to its objective as it is."""
    return tuple(name for name, _, slot in _public_output_slots(plan) if slot.is_loss)


def ahead_outputs(plan: Plan) -> dict[str, int]:
    """Public outputs that are a multi-token prediction module's logits (a slot with ``ahead_arg``), by
    name, each with how many tokens past the next it predicts."""
    return {
        name: int(step.spec.with_defaults(step.args)[slot.ahead_arg])
        for name, step, slot in _public_output_slots(plan)
        if slot.ahead_arg is not None
    }


def loss_precision(t: torch.Tensor) -> torch.Tensor:
    """``t`` in the dtype every loss (run, train, bench) is computed in: float32 at least, since bfloat16
    sums lose too much, and float64 stays float64 (``.float()`` would silently narrow it)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


class ModelOutput(NamedTuple):
    """``y, extras = model(x, ...)``: the main output and the public extra outputs by name."""

    y: torch.Tensor
    extras: dict[str, torch.Tensor]


# NamedTuple's generated __new__ is a Python function; tuple.__new__ builds the same object directly.
_new_output = tuple.__new__


def _pick_one(name: str, named: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return (named[name],)


def _pick_none(named: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return ()


def _picker(names: tuple[str, ...]) -> Callable[[Mapping[str, torch.Tensor]], tuple[torch.Tensor, ...]]:
    """``named -> tuple(named[n] for n in names)`` in one call (KeyError on a missing name). Built from
    picklable parts: a model stays picklable."""
    if len(names) == 1:
        return functools.partial(_pick_one, names[0])
    if not names:
        return functools.partial(_pick_none)
    return operator.itemgetter(*names)  # type: ignore[return-value]


def _name_one(name: str, outputs: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: outputs[1]}


def _name_all(names: tuple[str, ...], outputs: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    return dict(zip(names, outputs[1:], strict=False))  # the engine returns exactly one per name


def _namer(names: tuple[str, ...]) -> Callable[[Sequence[torch.Tensor]], dict[str, torch.Tensor]]:
    """``outputs -> {name: outputs[1 + i]}``: the public extra outputs by name (outputs[0] is y)."""
    if len(names) == 1:
        return functools.partial(_name_one, names[0])
    return functools.partial(_name_all, names)


COMPILE_REFUSED = (
    "compile=true is for the reference engine: torch.compile does not trace TE's fusible ops yet "
    "(TE issue #2590: graph breaks at every fuser, and their custom autograd functions); use "
    "engine=reference with compile=true, or compile=false"
)
"""Why ``compile=true`` is refused for the TE engine (here, so that saying it never imports TE)."""

ACTIVATION_CHECKPOINTING = ("none", "blocks", "all")
"""``train.activation_checkpointing``: keep every activation; recompute each block use's (each fuser's,
TE engine) in backward; recompute every step's."""


def check_checkpointing(level: str) -> None:
    """``ArgumentError`` unless ``level`` is one of ``ACTIVATION_CHECKPOINTING``."""
    if level not in ACTIVATION_CHECKPOINTING:
        raise ArgumentError(
            f"activation_checkpointing={level!r}: one of {', '.join(ACTIVATION_CHECKPOINTING)}"
        )


class BlockScope(torch.nn.ModuleDict):
    """The steps of one block use (``layers.3``) as one module that can be called: the unit FSDP2 shards
    by, activation checkpointing recomputes and ``torch.compile`` compiles. Its parameters keep their
    names (``steps.layers.3.norm.weight``); the engine sets ``runner`` (``ReferenceModel.configure``),
    which takes ``x`` and the tensors the use reads from outside and returns ``x`` and the tensors it
    hands on."""

    runner: Callable[..., tuple[torch.Tensor, ...]] | None = None

    def forward(self, x: torch.Tensor, *reads: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        if self.runner is None:
            raise ArgumentError("a block use runs as a unit only once its model is configured")
        return self.runner(x, *reads)


def add_step(
    steps: torch.nn.ModuleDict, name: str, module: torch.nn.Module, units: frozenset[str] = frozenset()
) -> None:
    """Register a step under its config name; a dotted name (a block use's ``layers.3.norm``) nests
    ``ModuleDict``s, so its parameters are ``steps.layers.3.norm.*``; a scope named in ``units`` (a block
    use) is a ``BlockScope``. ``ModuleDict[name] = m`` refuses names that shadow an ``nn.Module``
    attribute (``half``, ``float``, ``train``...), which are valid step names; writing ``_modules``
    directly keeps parameter names and item access working."""
    *scopes, last = name.split(".")
    node: torch.nn.Module = steps
    for depth, key in enumerate(scopes):
        child = node._modules.get(key)
        if child is None:
            scope = ".".join(scopes[: depth + 1])
            child = BlockScope() if scope in units else torch.nn.ModuleDict()
            node._modules[key] = child
        node = child
    node._modules[last] = module


def block_use_scopes(plan: Plan) -> frozenset[str]:
    """``layers.0``, ``layers.1``...: the scope of every use of every block step of ``plan``."""
    return frozenset(f"{group.name}.{use.index}" for group in plan.blocks for use in group.uses)


def tie_weights(steps: torch.nn.Module, plan: Plan) -> None:
    """Make each tied parameter (``Plan.tied_params``) the very Parameter it is tied to, so it gets both
    steps' gradients. Engines call it after constructing the steps and before anything captures their
    parameters (TE's ``OperationFuser`` lists them when it is built)."""
    for alias, owner in plan.tied_params.items():
        share_parameter(
            steps, alias.removeprefix("steps."), steps.get_parameter(owner.removeprefix("steps."))
        )


def share_parameter(steps: torch.nn.Module, name: str, parameter: torch.nn.Parameter) -> None:
    """Make ``name`` (dotted, under ``steps``) the very ``parameter``."""
    *path, leaf = name.split(".")
    setattr(steps.get_submodule(".".join(path)), leaf, parameter)


def _drop_tied(
    tied: Mapping[str, str], module: torch.nn.Module, state: dict[str, object], prefix: str, _meta: object
) -> None:
    """State-dict hook: a tied parameter is stored once, under the name of the one it is tied to."""
    for alias in tied:
        state.pop(prefix + alias, None)


def _fill_tied(
    tied: Mapping[str, str], module: torch.nn.Module, state: dict[str, object], prefix: str, *_rest: object
) -> None:
    """Load pre-hook: the tied parameter takes the value stored under its owner's name (an alias key
    given as well must hold the same values, or the two steps would not share a weight)."""
    for alias, owner in tied.items():
        if prefix + owner not in state:
            continue
        given = state.get(prefix + alias)
        value = state[prefix + owner]
        if isinstance(given, torch.Tensor) and isinstance(value, torch.Tensor):
            if given.shape != value.shape or not torch.equal(given.to(value.device), value):
                raise CallError(f"{alias} is tied to {owner}, but the state gives them different values")
        state[prefix + alias] = value


def store_ties_once(module: torch.nn.Module, plan: Plan) -> None:
    """Hooks that make ``module``'s state dict hold each tied weight once, under the name of the one it
    is tied to, and fill it back in on load (``_drop_tied``, ``_fill_tied``)."""
    tied = dict(plan.tied_params)
    if tied:
        module.register_state_dict_post_hook(functools.partial(_drop_tied, tied))
        module.register_load_state_dict_pre_hook(functools.partial(_fill_tied, tied))


def step_module(steps: torch.nn.Module, name: str) -> torch.nn.Module:
    """The module ``add_step`` registered under ``name``."""
    node = steps
    for key in name.split("."):
        found = node._modules[key]
        assert found is not None
        node = found
    return node


class AssembledModel(torch.nn.Module):
    """A built model. Parameters are named ``steps.<step name>.<TE parameter name>`` in every engine,
    so a state dict from one engine loads into another.

    Every call is checked against the plan before any op runs (``call_checks``): ``x``'s feature width
    (and its number of dims when the plan's ``input_layout`` is ``tokens`` or ``sequence``), each public
    input's shape, dtype kind and device. Everything a call needs (names, order, shape rules) is computed
    here, once."""

    engine: str = "?"

    def __init__(self, plan: Plan) -> None:
        super().__init__()
        self.plan = plan
        self.configured: dict[str, Any] = {}
        """What ``configure`` was last asked (``activation_checkpointing``, ``compile``)."""
        self.steps = torch.nn.ModuleDict()
        self.row_changing_steps: tuple[str, ...] = tuple(
            f"{s.name} ({s.type})" for s in plan.steps if isinstance(s.spec, OpSpec) and s.spec.changes_rows
        )
        """Steps that change the row count of the main path: with any, ``x`` must be [tokens, features]."""
        self._input_names = tuple(t.name for t in plan.public_inputs)
        self._output_names = tuple(t.name for t in plan.public_outputs)
        self._num_inputs = len(self._input_names)
        self._pick_inputs = _picker(self._input_names)
        self._name_extras = _namer(self._output_names)
        self._loss_output_names = loss_output_names(plan)
        self._checks = CallChecks(plan, self.row_changing_steps)
        self._check = self._checks.check
        self._reduction: TokenReduction | None = None
        self._unreduced: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]] | None = None
        store_ties_once(self, plan)

    def step_module(self, name: str) -> torch.nn.Module:
        """The module of step ``name`` (``layers.3.norm`` for a step of a block use)."""
        return step_module(self.steps, name)

    @property
    def input_names(self) -> list[str]:
        return list(self._input_names)

    @property
    def output_names(self) -> list[str]:
        return list(self._output_names)

    @property
    def loss_output_names(self) -> tuple[str, ...]:
        """The public outputs the caller adds to its loss (see ``loss_output_names``)."""
        return self._loss_output_names

    def forward(self, x: torch.Tensor, *extra_inputs: torch.Tensor, **named: torch.Tensor) -> ModelOutput:
        # The hot path of every caller, measured against a hand-built OperationFuser by
        # bench/te_overhead.py: no frame or lookup that forward_positional would repeat, and no generic
        # helper where a precomputed one does (each costs a visible share of a small model's step).
        if named or len(extra_inputs) != self._num_inputs:
            try:  # the usual named call: every public input by name, nothing else
                if extra_inputs or len(named) != self._num_inputs:
                    raise KeyError
                extra_inputs = self._pick_inputs(named)
            except KeyError:
                extra_inputs = tuple(self.order_inputs(extra_inputs, named))
        self._check(x, extra_inputs)
        outputs = self._forward_positional(x, *extra_inputs)
        if isinstance(outputs, torch.Tensor):
            return _new_output(ModelOutput, (outputs, {}))
        return _new_output(ModelOutput, (outputs[0], self._name_extras(outputs)))

    def forward_positional(
        self, x: torch.Tensor, *extra_inputs: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """TE's calling convention: public extra inputs in (basic-op, slot) order, fuser after fuser;
        returns ``x`` alone or ``(x, *public extra outputs)``. Every call path checks its tensors here,
        once; engines implement ``_forward_positional``."""
        if len(extra_inputs) != self._num_inputs:
            # TE's Sequential would silently drop surplus trailing inputs; a miscount is a caller bug.
            names = ", ".join(self._input_names) or "none"
            raise CallError(
                f"{self.plan.name} takes {len(self._input_names)} public extra input(s) ({names}), "
                f"got {len(extra_inputs)}"
            )
        self._check(x, extra_inputs)
        return self._forward_positional(x, *extra_inputs)

    def _forward_positional(
        self, x: torch.Tensor, *extra_inputs: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The engine's forward, every tensor already checked."""
        raise NotImplementedError

    @contextlib.contextmanager
    def reducing(self, asked: TokenReduction) -> Iterator[None]:
        """Inside, the main output is ``asked.reduce`` of the logits, computed chunk by chunk through the
        plan's head (``engines/head_chunks.py``); the extra outputs are as ever."""
        if self._reduction is not None:
            raise ArgumentError("the model already reduces its logits for another caller")
        saved = self.__dict__.get("_forward_positional")
        self._unreduced = saved if saved is not None else self._forward_positional
        self._reduction = asked
        self.__dict__["_forward_positional"] = self._forward_reduced
        try:
            yield
        finally:
            self._reduction, self._unreduced = None, None
            if saved is None:
                self.__dict__.pop("_forward_positional", None)
            else:
                self.__dict__["_forward_positional"] = saved

    def _forward_reduced(
        self, x: torch.Tensor, *extra_inputs: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The forward inside ``reducing``; engines with a head to run per chunk override it. Here: the
        logits whole, then reduced chunk by chunk."""
        assert self._reduction is not None and self._unreduced is not None
        outputs = self._unreduced(x, *extra_inputs)
        if isinstance(outputs, torch.Tensor):
            return reduce_whole_logits(outputs, self._reduction)
        return (reduce_whole_logits(outputs[0], self._reduction), *outputs[1:])

    def configure(
        self, *, activation_checkpointing: str = "none", compile: bool = False, sharded: bool = False
    ) -> None:
        """How the forward runs, decided once before training: ``activation_checkpointing``
        (``ACTIVATION_CHECKPOINTING``), ``compile`` (``torch.compile`` of each unit), ``sharded`` (FSDP2
        is about to shard the model: ``engines/parallel/fsdp.py``). The same numbers in every case."""
        raise ArgumentError(f"the {self.engine} engine cannot be configured")

    @property
    def runs_as_units(self) -> bool:
        """Whether ``configure`` cut the forward into units (checkpointed, compiled or sharded)."""
        return False

    def shard_units(self) -> list[torch.nn.Module]:
        """The modules FSDP2 shards one by one (each block use), after ``configure(sharded=True)``; the
        rest of the model is sharded as one."""
        return []

    def local_input_checks(self) -> None:
        """Check public inputs for layout and feature width only: for a rank of a parallel layout, whose
        inputs hold its own rows and expert groups (``CallChecks.local_rows``)."""
        self._checks.local_rows()

    def check_x(self, x: torch.Tensor) -> None:
        """Raise ``CallError`` unless ``x`` is a floating-point tensor of shape ``[..., in_features]``
        (``[tokens, in_features]`` or ``[batch, seq, in_features]`` as the plan's ``input_layout`` says)."""
        self._checks.check_x(x)

    def order_inputs(
        self, positional: Sequence[torch.Tensor], named: Mapping[str, torch.Tensor]
    ) -> list[torch.Tensor]:
        names = self._input_names
        if len(positional) > len(names):
            raise CallError(
                f"{self.plan.name} takes {len(names)} public extra input(s), got {len(positional)}"
            )
        if not named and len(positional) == len(names):
            return list(positional)
        if not positional and len(named) == len(names):
            try:  # the usual call: every input by name
                return [named[n] for n in names]
            except KeyError:
                pass  # the slow path below says which name is wrong
        values: dict[str, torch.Tensor] = dict(zip(names, positional, strict=False))
        for key, value in named.items():
            if key not in names:
                hint = did_you_mean(key, names)
                expected = ", ".join(names) or "none"
                raise CallError(
                    f"{self.plan.name} has no public input {key!r} (public inputs: {expected})"
                    + (f"; {hint}" if hint else "")
                )
            if key in values:
                raise CallError(f"public input {key!r} given twice")
            values[key] = value
        missing = [n for n in names if n not in values]
        if missing:
            raise CallError(f"{self.plan.name} is missing public input(s): {', '.join(missing)}")
        return [values[n] for n in names]

    def summary(self, width: int | None = None, expand: Sequence[str] = ()) -> str:
        """The ``explain`` tables of this model (steps with TE basic-op indices, fusers, channels, call
        signature, parameter counts) as text, from the same code as ``python -m te_assembly explain``.
        Works without a terminal; ``width`` in columns (default: the terminal's, else 120). Block steps
        are collapsed unless ``expand`` names them, as ``explain.expand`` does (``["all"]``, ``["layers"]``,
        ``["layers.3"]``). At a Python prompt it shows as the tables; ``print(model.summary())`` prints
        them. Drawn by ``te_assembly.views.model`` (the layer above the engines; ``display.py``)."""
        return display.views().summary(self, width, expand)  # type: ignore[no-any-return]

    def plot(self, path: str | os.PathLike[str], expand: Sequence[str] = ()) -> Path:
        """Draw the channel graph into ``path``, as ``python -m te_assembly graph`` does; the format from
        the suffix: ``.mmd`` (Mermaid), ``.dot`` (Graphviz DOT), ``.svg``/``.png`` (need Graphviz's
        ``dot``: ``MissingToolError`` without it). Block steps collapsed unless ``expand`` names them.
        Returns the path."""
        return display.views().plot(self, path, expand)  # type: ignore[no-any-return]

    def name_outputs(self, outputs: torch.Tensor | tuple[torch.Tensor, ...]) -> ModelOutput:
        if isinstance(outputs, torch.Tensor):
            return ModelOutput(outputs, {})
        return ModelOutput(outputs[0], dict(zip(self._output_names, outputs[1:], strict=True)))


__all__ = [
    "ACTIVATION_CHECKPOINTING",
    "AssembledModel",
    "BlockScope",
    "CallError",
    "InputShapeError",
    "ModelOutput",
    "add_step",
    "ahead_outputs",
    "block_use_scopes",
    "check_checkpointing",
    "checkpointed",
    "loss_output_names",
    "loss_precision",
    "share_parameter",
    "step_module",
    "store_ties_once",
    "tie_weights",
]
