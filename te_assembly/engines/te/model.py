"""The TE engine's model: TE ``OperationFuser``s (built and locked at build time) and torch modules."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch
from transformer_engine.pytorch.ops.fuser import OperationFuser

from te_assembly.analysis.plan import Plan
from te_assembly.engines.base import (
    COMPILE_REFUSED,
    AssembledModel,
    CallError,
    check_checkpointing,
    checkpointed,
)
from te_assembly.engines.head_chunks import reduced_in_chunks
from te_assembly.engines.te.routing import FuserIO, fuser_io
from te_assembly.errors import ArgumentError


def _autocast(te_recipe: object) -> contextlib.AbstractContextManager[Any]:
    import transformer_engine.pytorch as te

    enabled = te_recipe is not None
    autocast = getattr(te, "autocast", None)
    if autocast is not None:
        return autocast(enabled=enabled, recipe=te_recipe)
    return te.fp8_autocast(enabled=enabled, fp8_recipe=te_recipe)  # TE before 2.9


class _FreshParams:
    """An ``OperationFuser`` call that hands autograd its basic ops' parameters as they are now.

    TE's fuser lists them once, when it is built (``_flat_basic_op_params``), and passes that list to
    its autograd function on every call; FSDP2 swaps other Parameter objects in for each forward (the
    gathered ones) and reduces the gradients those receive. Listed again on each call, the fuser's
    gradients land where FSDP2 looks for them (TE issue #2713: no FSDP2 support in ``te.ops`` yet)."""

    def __init__(self, fuser: OperationFuser) -> None:
        self.fuser = fuser

    def __call__(self, x: torch.Tensor, *extra_inputs: torch.Tensor) -> Any:
        fuser = self.fuser
        fuser._basic_op_params = [list(op.parameters()) for op in fuser._basic_ops]
        fuser._flat_basic_op_params = [p for params in fuser._basic_op_params for p in params]
        return fuser(x, *extra_inputs)


class TEModel(AssembledModel):
    """Runs like ``te.ops.Sequential.forward`` over prebuilt fusers, with the plan's call API.

    The call path is planned at ``attach`` time: the fusers and modules in order, how many public
    inputs each fuser takes, whether a ``te.autocast`` is needed at all. A call then only slices its
    inputs and calls each fuser, as a hand-built ``OperationFuser`` caller would."""

    engine = "te"

    def __init__(
        self, plan: Plan, kernels: str, recipe: Mapping[str, Any] | None = None, te_recipe: object = None
    ) -> None:
        super().__init__(plan)
        self.kernels = kernels
        self.recipe = dict(recipe) if recipe is not None else None
        self.te_recipe = te_recipe
        self.groups: list[OperationFuser | str] = []
        """In plan order: a fuser, or the name of the module step between two fusers."""
        self.routing: list[FuserIO] = fuser_io(plan)
        """Each fuser's public inputs and outputs: the caller's, and the channels rerouted across fusers."""
        self._num_registers = len(plan.reroutes)
        from te_assembly.analysis.recipe_shapes import token_multiple

        self.token_rule = token_multiple(plan.steps, recipe) if te_recipe is not None else None
        """(multiple, step): the recipe quantizes a GEMM over the caller's token rows."""
        self._program: tuple[tuple[Callable[..., Any], int], ...] = ()
        self._routed: tuple[tuple[Callable[..., Any], FuserIO | None], ...] = ()
        self.head_splits = False
        """A step of the plan's head is split across tensor-parallel ranks: the logits are reduced whole
        (``engines/head_chunks.py``)."""
        self._head_group: int | None = None
        self._head_calls: tuple[Callable[..., Any], ...] = ()
        # Without a GPU and without a recipe, even ``autocast(enabled=False)`` asks the GPU for TE's
        # default recipe; and asking torch for the GPU on every call costs time, so decide once.
        self._autocast = te_recipe is not None or torch.cuda.is_available()

    def attach(self, groups: list[OperationFuser | str]) -> None:
        """Set the fusers and module steps (in plan order) and precompute the call path."""
        self.groups = groups
        self._program = tuple(
            (g, g.num_extra_inputs) if isinstance(g, OperationFuser) else (self.step_module(g), -1)
            for g in groups
        )
        ios = iter(self.routing)
        self._routed = tuple(
            (g, next(ios)) if isinstance(g, OperationFuser) else (self.step_module(g), None) for g in groups
        )
        self._head_group = None if self.head_splits else _head_group(self.plan)
        self._head_calls = self._head_group_calls(sharded=False)
        self.__dict__.pop("_forward_positional", None)
        if len(groups) == 1 and isinstance(groups[0], OperationFuser) and not self._autocast:
            # One fuser and nothing around it (the common case on CPU): a checked call goes straight to
            # the fuser, exactly what a hand-built OperationFuser caller runs.
            self.__dict__["_forward_positional"] = groups[0]

    def configure(
        self, *, activation_checkpointing: str = "none", compile: bool = False, sharded: bool = False
    ) -> None:
        """``activation_checkpointing``: ``blocks`` and ``all`` both recompute each fuser (and module
        step) in backward: a fuser is the smallest unit TE runs. ``sharded``: each fuser lists its
        parameters again on every call (``_FreshParams``). ``compile`` is refused (TE issue #2590)."""
        if compile:
            raise ArgumentError(COMPILE_REFUSED)
        check_checkpointing(activation_checkpointing)
        self.configured = {"activation_checkpointing": activation_checkpointing, "compile": compile}
        self.attach(self.groups)
        if activation_checkpointing == "none" and not sharded:
            return
        self.__dict__.pop("_forward_positional", None)

        def wrapped(group: Any) -> Any:
            call = _FreshParams(group) if sharded and isinstance(group, OperationFuser) else group
            return functools.partial(checkpointed, call) if activation_checkpointing != "none" else call

        self._program = tuple((wrapped(g), count) for g, count in self._program)
        self._routed = tuple((wrapped(g), io) for g, io in self._routed)
        self._head_calls = self._head_group_calls(sharded)

    def _head_group_calls(self, sharded: bool) -> tuple[Callable[..., Any], ...]:
        """The head's fusers and module steps as callables, without activation checkpointing (each
        chunk of the head is recomputed as a whole already)."""
        if self._head_group is None:
            return ()
        return tuple(
            (_FreshParams(g) if sharded else g) if isinstance(g, OperationFuser) else self.step_module(g)
            for g in self.groups[self._head_group :]
        )

    @property
    def fusers(self) -> list[OperationFuser]:
        return [g for g in self.groups if isinstance(g, OperationFuser)]

    def quantization(self) -> contextlib.AbstractContextManager[Any]:
        """``te.autocast(enabled=recipe is not None, recipe=recipe)``. Without a GPU and without a recipe
        it is skipped: even ``autocast(enabled=False)`` asks the GPU for TE's default recipe."""
        if not self._autocast:
            return contextlib.nullcontext()
        return _autocast(self.te_recipe)

    def _forward_positional(
        self, x: torch.Tensor, *extra_inputs: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        self._check_token_rows(x)
        if self._autocast:
            with _autocast(self.te_recipe):
                result = self._run(x, extra_inputs)
        else:
            result = self._run(x, extra_inputs)
        return result

    def _forward_reduced(
        self, x: torch.Tensor, *extra_inputs: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The fusers before the head, then the head's chunk by chunk (``engines/head_chunks.py``)."""
        if self._head_group is None:
            return super()._forward_reduced(x, *extra_inputs)
        assert self._reduction is not None
        self._check_token_rows(x)
        with self.quantization():
            result = self._run(x, extra_inputs, self._head_group)
            hidden = result if isinstance(result, torch.Tensor) else result[0]
            y = reduced_in_chunks(hidden, self._run_head, self._reduction, self._head_modules())
        return y if isinstance(result, torch.Tensor) else (y, *result[1:])

    def _head_modules(self) -> list[torch.nn.Module]:
        """The modules the head runs: its fusers' basic ops and its module steps."""
        assert self._head_group is not None
        return [
            op
            for g in self.groups[self._head_group :]
            for op in (g._basic_ops if isinstance(g, OperationFuser) else [self.step_module(g)])
        ]

    def _run_head(self, x: torch.Tensor) -> torch.Tensor:
        for call in self._head_calls:
            x = call(x)
        return x

    def _run(
        self, x: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...], stop: int | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if self._num_registers:
            return self._run_rerouted(x, extra_inputs, stop)
        program = self._program if stop is None else self._program[:stop]
        if len(program) == 1 and program[0][1] >= 0:  # one fuser, no module step: no bookkeeping
            return program[0][0](x, *extra_inputs)  # type: ignore[no-any-return]
        outputs: list[torch.Tensor] = []
        used = 0
        for group, count in program:
            if count < 0:
                x = group(x)
                continue
            result = group(x, *extra_inputs[used : used + count])
            used += count
            if isinstance(result, tuple):
                x = result[0]
                outputs.extend(result[1:])
            else:
                x = result
        return (x, *outputs) if outputs else x

    def _run_rerouted(
        self, x: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...], stop: int | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Fusers and modules in order, the rerouted channels passed from fuser to fuser (``routing.py``)."""
        registers: list[torch.Tensor | None] = [None] * self._num_registers
        outputs: list[torch.Tensor | None] = [None] * len(self._output_names)
        for group, io in self._routed if stop is None else self._routed[:stop]:
            if io is None:
                x = group(x)
                continue
            args = [extra_inputs[i] if i >= 0 else registers[-1 - i] for i in io.inputs]
            result = group(x, *args)
            if not io.outputs:
                x = result
                continue
            x = result[0]
            for value, (to_caller, to_register) in zip(result[1:], io.outputs, strict=True):
                if to_caller >= 0:
                    outputs[to_caller] = value
                if to_register >= 0:
                    registers[to_register] = value
        return (x, *outputs) if outputs else x  # type: ignore[arg-type]

    def _check_token_rows(self, x: torch.Tensor) -> None:
        if self.token_rule is None or x.dim() == 0 or not x.shape[-1]:
            return
        multiple, step = self.token_rule
        rows = x.numel() // x.shape[-1]
        if rows % multiple:
            name = (self.recipe or {}).get("name") or (self.recipe or {}).get("kind")
            padded = -(-rows // multiple) * multiple
            raise CallError(
                f"recipe {name} quantizes step {step!r}, a GEMM over all {rows} token rows of x; its "
                f"GEMMs need a multiple of {multiple} rows (pad the batch to {padded} rows)"
            )


def _head_group(plan: Plan) -> int | None:
    """How many fusers and module steps run before the plan's head (the fusers are cut where it
    begins: ``analysis/fusers.py``), or None without a head."""
    if plan.head is None:
        return None
    fusers: set[int] = set()
    groups = 0
    for step in plan.steps:
        if step.index == plan.head:
            return groups
        if step.kind == "module":
            groups += 1
        elif step.fuser not in fusers:
            fusers.add(step.fuser)  # type: ignore[arg-type]
            groups += 1
    return None
