"""What every engine's model looks like to its caller: one call API, one parameter naming."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch

from te_assembly.catalog import OpSpec
from te_assembly.diagnostics import did_you_mean
from te_assembly.errors import TeAssemblyError
from te_assembly.plan import Plan


class CallError(TeAssemblyError, TypeError):
    """A model was called with missing, unknown or surplus public inputs."""


def loss_output_names(plan: Plan) -> tuple[str, ...]:
    """Public outputs that are loss terms (a slot with ``is_loss``, e.g. TopKRouter's aux_loss), whatever
    channel name the config gives them: the caller adds each to its objective as it is."""
    steps = plan.steps_by_index
    return tuple(t.name for t in plan.public_outputs if steps[t.ref.step].output_slots[t.ref.slot].is_loss)


def loss_precision(t: torch.Tensor) -> torch.Tensor:
    """``t`` in the dtype every loss (run, train, bench) is computed in: float32 at least, since bfloat16
    sums lose too much, and float64 stays float64 (``.float()`` would silently narrow it)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


class ModelOutput(NamedTuple):
    """``y, extras = model(x, ...)``: the main output and the public extra outputs by name."""

    y: torch.Tensor
    extras: dict[str, torch.Tensor]


class AssembledModel(torch.nn.Module):
    """A built model. Parameters are named ``steps.<step name>.<TE parameter name>`` in every engine,
    so a state dict from one engine loads into another."""

    engine: str = "?"

    def __init__(self, plan: Plan) -> None:
        super().__init__()
        self.plan = plan
        self.steps = torch.nn.ModuleDict()
        self.row_changing_steps: tuple[str, ...] = tuple(
            f"{s.name} ({s.type})" for s in plan.steps if isinstance(s.spec, OpSpec) and s.spec.changes_rows
        )
        """Steps that change the row count of the main path: with any, ``x`` must be [tokens, features]."""

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.plan.public_inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.plan.public_outputs]

    @property
    def loss_output_names(self) -> tuple[str, ...]:
        """The public outputs the caller adds to its loss (see ``loss_output_names``)."""
        return loss_output_names(self.plan)

    def forward(self, x: torch.Tensor, *extra_inputs: torch.Tensor, **named: torch.Tensor) -> ModelOutput:
        ordered = self.order_inputs(extra_inputs, named)
        return self.name_outputs(self.forward_positional(x, *ordered))

    def forward_positional(
        self, x: torch.Tensor, *extra_inputs: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """TE's calling convention: public extra inputs in (basic-op, slot) order, fuser after fuser;
        returns ``x`` alone or ``(x, *public extra outputs)``. Every call path checks ``x`` here, once;
        engines implement ``_forward_positional``."""
        self.check_x(x)
        return self._forward_positional(x, *extra_inputs)

    def _forward_positional(
        self, x: torch.Tensor, *extra_inputs: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The engine's forward, ``x`` already checked."""
        raise NotImplementedError

    def check_x(self, x: torch.Tensor) -> None:
        """Models whose steps change the row count (MoE dispatch/combine) index rows of a 2-D tensor:
        a [batch, seq, hidden] ``x`` would fail deep inside with a broadcasting error. Other models take
        any [..., features]."""
        if self.row_changing_steps and x.dim() != 2:
            raise CallError(
                f"{self.plan.name} changes the number of rows at {', '.join(self.row_changing_steps)}, so x "
                f"must be a 2-D [tokens, features] tensor; got shape {tuple(x.shape)}: pass "
                f"x.reshape(-1, {self.plan.in_features}) and reshape y back"
            )

    def order_inputs(
        self, positional: Sequence[torch.Tensor], named: Mapping[str, torch.Tensor]
    ) -> list[torch.Tensor]:
        names = self.input_names
        if len(positional) > len(names):
            raise CallError(
                f"{self.plan.name} takes {len(names)} public extra input(s), got {len(positional)}"
            )
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

    def name_outputs(self, outputs: torch.Tensor | tuple[torch.Tensor, ...]) -> ModelOutput:
        if isinstance(outputs, torch.Tensor):
            return ModelOutput(outputs, {})
        return ModelOutput(outputs[0], dict(zip(self.output_names, outputs[1:], strict=True)))
