"""The synthetic task: regress a fixed random teacher built from the same plan with another seed.

Each step's batch is a pure function of ``(seed, step)``, so a resumed run sees exactly the data an
uninterrupted one would, without replaying any random stream.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from te_assembly.analysis.plan import Plan
from te_assembly.engines.base import AssembledModel, loss_precision
from te_assembly.engines.data import DEFAULT_SEQ_LEN, sample_public_inputs, sample_x

RowSelector = Callable[[torch.Tensor, dict[str, torch.Tensor]], tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass
class Batch:
    x: torch.Tensor
    inputs: dict[str, torch.Tensor]
    target: torch.Tensor


def step_seed(seed: int, step: int) -> int:
    """A distinct, platform-independent generator seed per (seed, step)."""
    return (seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9) % (2**63)


class TeacherTask:
    """Batches ``(x, public inputs, teacher(x))``; the teacher never trains and its outputs are detached."""

    def __init__(
        self,
        plan: Plan,
        teacher: AssembledModel,
        *,
        seed: int,
        tokens: int,
        device: torch.device,
        dtype: torch.dtype,
        rows: RowSelector | None = None,
        seq_len: int = DEFAULT_SEQ_LEN,
    ) -> None:
        self.plan = plan
        self.seq_len = seq_len
        """Positions per sequence, for a model that takes ``[batch, seq, features]``."""
        self.rows = rows
        """Parallel runs: this rank's rows of each batch (x and public inputs), before the teacher runs."""
        self.teacher = teacher.eval().requires_grad_(False)
        self.seed = seed
        self.tokens = tokens
        self.device = device
        self.dtype = dtype

    def batch(self, step: int) -> Batch:
        generator = torch.Generator().manual_seed(step_seed(self.seed, step))
        dev, dtype, seq_len = self.device, self.dtype, self.seq_len
        x = sample_x(self.plan, self.tokens, generator=generator, device=dev, dtype=dtype, seq_len=seq_len)
        inputs = sample_public_inputs(
            self.plan, self.tokens, generator=generator, device=dev, dtype=dtype, seq_len=seq_len
        )
        if self.rows is not None:
            x, inputs = self.rows(x, inputs)
        with torch.no_grad():
            target = self.teacher(x, **inputs).y.detach()
        return Batch(x, inputs, target)


def perturb_constant_parameters(model: torch.nn.Module, scale: float = 0.1) -> list[str]:
    """Add N(0, scale^2) noise (from torch's global RNG) to every parameter whose elements are all equal.

    Biases start at zero and norm scales at one in both models whatever the seed, so without this a
    block made only of such ops (Bias, ConstantScale, ...) would have a teacher equal to its student."""
    changed = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            flat = p.detach().reshape(-1)
            if flat.numel() and bool((flat == flat[0]).all()):
                p.add_(torch.randn_like(p) * scale)
                changed.append(name)
    return changed


def aux_losses(extras: Mapping[str, torch.Tensor], loss_names: Sequence[str]) -> dict[str, torch.Tensor]:
    """The public outputs named in ``loss_names`` (``engines.base.loss_output_names``: slots the catalog
    marks ``is_loss``, whatever their channel is called); they join the objective as they are (the op
    already weights them, e.g. TopKRouter's ``aux_loss_coeff``)."""
    return {
        name: loss_precision(extras[name]).sum() for name in loss_names if extras[name].is_floating_point()
    }


def loss_terms(
    y: torch.Tensor, target: torch.Tensor, extras: Mapping[str, torch.Tensor], loss_names: Sequence[str]
) -> dict[str, torch.Tensor]:
    """Named terms of the objective, in float32 at least (``loss_precision``): the regression error,
    then each aux loss."""
    terms = {"mse(y, teacher)": torch.nn.functional.mse_loss(loss_precision(y), loss_precision(target))}
    terms.update(aux_losses(extras, loss_names))
    return terms
