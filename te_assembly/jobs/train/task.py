"""The synthetic task: regress a fixed random teacher built from the same plan with another seed.

Each step's batch is a pure function of ``(seed, step)``, so a resumed run sees exactly the data an
uninterrupted one would, without replaying any random stream.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from te_assembly.analysis.plan import Plan
from te_assembly.data.batch_seeds import step_seed
from te_assembly.engines.base import AssembledModel
from te_assembly.engines.data import DEFAULT_SEQ_LEN
from te_assembly.engines.target import Target
from te_assembly.jobs import objective


@dataclass
class Batch:
    x: torch.Tensor
    inputs: dict[str, torch.Tensor]
    target: torch.Tensor
    documents: torch.Tensor | None = None
    """Packed rows (``data.packing``): each position's document (``engines/reference/packing.py``)."""


class TeacherTask:
    """Batches ``(x, public inputs, teacher(x))``; the teacher never trains and its outputs are detached."""

    def __init__(
        self,
        plan: Plan,
        teacher: AssembledModel,
        target: Target,
        *,
        tokens: int,
        seq_len: int = DEFAULT_SEQ_LEN,
    ) -> None:
        self.plan = plan
        self.teacher = teacher.eval().requires_grad_(False)
        self.target = target
        """Device, dtype and seed; under a parallel layout each batch is this rank's rows, taken before
        the teacher runs."""
        self.tokens = tokens
        self.seq_len = seq_len
        """Positions per sequence, for a model that takes ``[batch, seq, features]``."""

    is_language_model = False

    def batch(self, step: int, micro: int = 0, micros: int = 1) -> Batch:
        """Step ``step``'s batch, or its micro-batch ``micro`` of ``micros`` (gradient accumulation; the
        first is the one a run without accumulation draws)."""
        generator = torch.Generator().manual_seed(step_seed(self.target.seed, step, micro))
        x, inputs = self.target.sample(self.plan, self.tokens // micros, generator, self.seq_len)
        with torch.no_grad():
            target = self.teacher(x, **inputs).y.detach()
        return Batch(x, inputs, target)

    def head_request(self, batch: Batch) -> None:
        """The teacher's regression needs the whole output (``LanguageTask.head_request``)."""
        return None

    def terms(
        self, y: torch.Tensor, extras: Mapping[str, torch.Tensor], batch: Batch, loss_names: Sequence[str]
    ) -> dict[str, torch.Tensor]:
        return loss_terms(y, batch.target, extras, loss_names)

    def evaluate(self, model: torch.nn.Module, batches: int) -> None:
        """The teacher task has no held-out data: its training loss is its measure."""
        return None


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


def loss_terms(
    y: torch.Tensor, target: torch.Tensor, extras: Mapping[str, torch.Tensor], loss_names: Sequence[str]
) -> dict[str, torch.Tensor]:
    """The training objective's named terms (``jobs/objective.py``): the regression error, then each
    loss output."""
    return objective.loss_terms(y, extras, loss_names, target=target)
