"""The objective every job computes, written once: a main term, plus every loss output the model
returns (slots the catalog marks ``is_loss``, e.g. TopKRouter's ``aux_loss``, whatever their channel is
called; added as they are: the op already weights them), in float32 at least (``loss_precision``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from te_assembly.engines.base import loss_precision

MEAN_SQUARE = "mean(y^2)"
TEACHER_MSE = "mse(y, teacher)"


def aux_losses(extras: Mapping[str, torch.Tensor], loss_names: Sequence[str]) -> dict[str, torch.Tensor]:
    """The public outputs named in ``loss_names`` (``engines.base.loss_output_names``), each summed."""
    return {
        name: loss_precision(extras[name]).sum() for name in loss_names if extras[name].is_floating_point()
    }


def loss_terms(
    y: torch.Tensor,
    extras: Mapping[str, torch.Tensor],
    loss_names: Sequence[str],
    *,
    target: torch.Tensor | None = None,
    other_outputs: bool = False,
) -> dict[str, torch.Tensor]:
    """Named terms of the objective: the main term (``mse(y, target)`` when a target is given, else the
    mean square of ``y``), then each loss output; ``other_outputs``: also the mean square of every other
    public float output, so gradients come back from the caller for them as they would in training."""
    if target is not None:
        main = torch.nn.functional.mse_loss(loss_precision(y), loss_precision(target))
        terms = {TEACHER_MSE: main}
    else:
        terms = {MEAN_SQUARE: loss_precision(y).square().mean()}
    for name, value in extras.items():
        if not value.is_floating_point():
            continue
        if name in loss_names:
            terms[name] = loss_precision(value).sum()
        elif other_outputs:
            terms[name] = loss_precision(value).square().mean()
    return terms


def total(terms: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The objective: the sum of its terms (in the widest of their dtypes)."""
    values = list(terms.values())
    dtype = values[0].dtype
    for value in values[1:]:
        dtype = torch.promote_types(dtype, value.dtype)
    return torch.stack([v.to(dtype) for v in values]).sum()


def objective(
    y: torch.Tensor,
    extras: Mapping[str, torch.Tensor],
    loss_names: Sequence[str],
    *,
    target: torch.Tensor | None = None,
    other_outputs: bool = False,
) -> torch.Tensor:
    """``total(loss_terms(...))``."""
    return total(loss_terms(y, extras, loss_names, target=target, other_outputs=other_outputs))


__all__ = ["MEAN_SQUARE", "TEACHER_MSE", "aux_losses", "loss_terms", "objective", "total"]
