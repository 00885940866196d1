"""The TE engine's model: TE ``OperationFuser``s (built and locked at build time) and torch modules."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from transformer_engine.pytorch.ops.fuser import OperationFuser

from te_assembly.engines.base import AssembledModel, CallError
from te_assembly.plan import Plan


def _autocast(te_recipe: object) -> contextlib.AbstractContextManager[Any]:
    import transformer_engine.pytorch as te

    enabled = te_recipe is not None
    autocast = getattr(te, "autocast", None)
    if autocast is not None:
        return autocast(enabled=enabled, recipe=te_recipe)
    return te.fp8_autocast(enabled=enabled, fp8_recipe=te_recipe)  # TE before 2.9


class TEModel(AssembledModel):
    """Runs like ``te.ops.Sequential.forward`` over prebuilt fusers, with the plan's call API."""

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
        from te_assembly.validate.recipe_shapes import token_multiple

        self.token_rule = token_multiple(plan.steps, recipe) if te_recipe is not None else None
        """(multiple, step): the recipe quantizes a GEMM over the caller's token rows."""

    @property
    def fusers(self) -> list[OperationFuser]:
        return [g for g in self.groups if isinstance(g, OperationFuser)]

    def quantization(self) -> contextlib.AbstractContextManager[Any]:
        """``te.autocast(enabled=recipe is not None, recipe=recipe)``. Without a GPU and without a recipe
        it is skipped: even ``autocast(enabled=False)`` asks the GPU for TE's default recipe."""
        if self.te_recipe is None and not torch.cuda.is_available():
            return contextlib.nullcontext()
        return _autocast(self.te_recipe)

    def _forward_positional(
        self, x: torch.Tensor, *extra_inputs: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        expected = len(self.plan.public_inputs)
        if len(extra_inputs) != expected:
            # Sequential would silently drop surplus trailing inputs; a miscount is a caller bug.
            names = ", ".join(self.input_names) or "none"
            raise CallError(
                f"{self.plan.name} takes {expected} public extra input(s) ({names}), got {len(extra_inputs)}"
            )
        self._check_token_rows(x)
        outputs: list[torch.Tensor] = []
        remaining = tuple(extra_inputs)
        with self.quantization():
            for group in self._iter_groups():
                if isinstance(group, OperationFuser):
                    count = group.num_extra_inputs
                    result = group(x, *remaining[:count])
                    remaining = remaining[count:]
                    if isinstance(result, tuple):
                        x = result[0]
                        outputs.extend(result[1:])
                    else:
                        x = result
                else:
                    x = group(x)
        return (x, *outputs) if outputs else x

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

    def _iter_groups(self) -> Iterator[OperationFuser | torch.nn.Module]:
        for group in self.groups:
            yield group if isinstance(group, OperationFuser) else self.steps[group]
