"""Preference tuning (``train.objective=dpo``): direct preference optimisation and its IPO and SimPO
variants, on ``data.format=preference`` pairs (``data/preference.py``).

Each pair's chosen and rejected rows run through the model in one batch (chosen rows first); an answer's
log-probability is the sum over its tokens of log softmax(logits)[next token], in float32 at least.
The frozen reference is the starting weights: with LoRA the same model with its adapters off (no second
copy), otherwise a copy of the model as training starts (``train.init_from``'s weights, also on a
resume). With ``margin = (chosen - reference chosen) - (rejected - reference rejected)``:

- ``sigmoid`` (DPO): ``-log sigmoid(beta * margin)``: ln 2 while the policy is the reference;
- ``ipo`` (IPO): ``(margin - 1 / (2 beta))^2``, the log-probabilities averaged over the answer's tokens;
- ``simpo`` (SimPO, reference-free): ``-log sigmoid(beta * (mean chosen - mean rejected) - gamma)``.

Each averaged over the pairs, as TRL's ``DPOTrainer`` (``loss_type`` sigmoid, ipo) and ``CPOTrainer``
(``loss_type="simpo"``) compute them. Per step: the rewards ``beta * (log-probability - reference's)``
of the chosen and rejected answers (SimPO: ``beta *`` the mean log-probability), their margin and the
share of pairs whose chosen reward is the higher (accuracy).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch.nn import functional

from te_assembly.engines.base import loss_precision
from te_assembly.engines.head_chunks import TokenReduction, reduced_logits
from te_assembly.engines.reference.ops.adapters import adapters_disabled
from te_assembly.jobs import objective
from te_assembly.jobs.train.lm_task import LanguageTask
from te_assembly.jobs.train.settings import DPOSettings
from te_assembly.jobs.train.task import Batch

DPO_LOSS = "dpo"
"""The objective's term."""


@dataclass(frozen=True)
class PairLogps:
    """Per pair: the answers' summed log-probabilities and their token counts."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    chosen_tokens: torch.Tensor
    rejected_tokens: torch.Tensor

    def means(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.chosen / self.chosen_tokens, self.rejected / self.rejected_tokens


def pair_logps(logits: torch.Tensor, labels: torch.Tensor, reduced: bool = False) -> PairLogps:
    """``logits`` ``[2 * pairs, seq, vocab]`` and ``labels`` ``[2 * pairs, seq]`` (the chosen rows, then
    the rejected; -100 outside the answers) as each answer's summed log-probability and token count;
    ``reduced``: ``logits`` are ``objective.next_token_reduction``'s per-token cross-entropies instead."""
    kept = labels != objective.IGNORE_INDEX
    if reduced:
        per_token = -logits
    else:
        safe = labels.masked_fill(~kept, 0)
        per_token = torch.gather(functional.log_softmax(loss_precision(logits), dim=-1), -1, safe[..., None])
    sums = (per_token[..., 0] * kept).sum(-1)
    counts = kept.sum(-1).clamp(min=1).to(sums.dtype)
    pairs = labels.shape[0] // 2
    return PairLogps(sums[:pairs], sums[pairs:], counts[:pairs], counts[pairs:])


def dpo_loss(
    policy: PairLogps, reference: PairLogps | None, settings: DPOSettings
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The mean loss over the pairs and the step's measures (module docstring)."""
    beta = settings.beta
    if settings.loss == "simpo":
        chosen, rejected = policy.means()
        losses = -functional.logsigmoid(beta * (chosen - rejected) - settings.simpo_gamma)
        chosen_rewards, rejected_rewards = beta * chosen.detach(), beta * rejected.detach()
    else:
        assert reference is not None, "DPO and IPO compare with the reference"
        if settings.loss == "ipo":
            (chosen, rejected), (ref_chosen, ref_rejected) = policy.means(), reference.means()
        else:
            chosen, rejected = policy.chosen, policy.rejected
            ref_chosen, ref_rejected = reference.chosen, reference.rejected
        margin = (chosen - ref_chosen) - (rejected - ref_rejected)
        if settings.loss == "ipo":
            losses = (margin - 1 / (2 * beta)) ** 2
        else:
            losses = -functional.logsigmoid(beta * margin)
        chosen_rewards = beta * (chosen - ref_chosen).detach()
        rejected_rewards = beta * (rejected - ref_rejected).detach()
    measures = {
        "rewards/chosen": chosen_rewards.mean(),
        "rewards/rejected": rejected_rewards.mean(),
        "rewards/margin": (chosen_rewards - rejected_rewards).mean(),
        "rewards/accuracy": (chosen_rewards > rejected_rewards).to(chosen_rewards.dtype).mean(),
    }
    return losses.mean(), measures


class PreferenceTask(LanguageTask):
    """A language task on preference pairs with the DPO objective (module docstring); ``attach`` gives
    it the model (and so its reference) once built."""

    def __init__(self, *args: object, dpo: DPOSettings, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.dpo = dpo
        self.reference: torch.nn.Module | None = None
        """The model the reference log-probabilities come from: the policy itself with its adapters off
        (``adapters_off``), or a frozen copy with the starting weights; None: reference-free (SimPO)."""
        self.adapters_off = False
        self.measures: dict[str, float] = {}

    def attach(
        self, model: torch.nn.Module, adapters: bool, load_start: Callable[[torch.nn.Module], None]
    ) -> None:
        """The reference: ``model`` with its adapters off (LoRA), or a frozen copy of it with the
        starting weights (``load_start`` puts them in: ``train.init_from``'s, or the seed's as built)."""
        if self.dpo.loss == "simpo":
            return  # reference-free
        if adapters:
            self.reference, self.adapters_off = model, True
            return
        frozen = copy.deepcopy(model).eval().requires_grad_(False)
        load_start(frozen)
        self.reference = frozen

    def batch(self, step: int, micro: int = 0, micros: int = 1) -> Batch:
        batch = super().batch(step, micro, micros)
        reference = None
        if self.reference is not None:
            asked = self.reduction(batch.target, summed=False)
            with torch.no_grad(), reduced_logits(self.reference, asked):
                if self.adapters_off:
                    y = _without_adapters(self.reference, batch.x)
                else:
                    y = self.reference(batch.x)[0]
                reference = pair_logps(y, batch.target, asked is not None)
        return PreferenceBatch(batch.x, batch.inputs, batch.target, reference=reference)

    def head_request(self, batch: Batch) -> TokenReduction | None:
        """Each row's log-probabilities, weighed by its pair: recomputed in backward, not summed."""
        return self.reduction(batch.target, summed=False)

    def terms(
        self, y: torch.Tensor, extras: Mapping[str, torch.Tensor], batch: Batch, loss_names: Sequence[str]
    ) -> dict[str, torch.Tensor]:
        reference = batch.reference if isinstance(batch, PreferenceBatch) else None
        policy = pair_logps(y, batch.target, self.chunk_tokens is not None)
        loss, measures = dpo_loss(policy, reference, self.dpo)
        self.measures = {name: float(value) for name, value in measures.items()}
        terms = {DPO_LOSS: loss}
        terms.update(objective.aux_losses(extras, loss_names))
        return terms

    def evaluate(self, model: torch.nn.Module, batches: int) -> None:
        """Preference runs have no held-out measure yet: the training measures are per step."""
        return None


@dataclass
class PreferenceBatch(Batch):
    reference: PairLogps | None = None


def _without_adapters(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    was = model.training
    model.eval()  # no adapter dropout in the reference either
    try:
        with adapters_disabled():
            return model(x)[0]
    finally:
        model.train(was)


__all__ = ["DPO_LOSS", "PairLogps", "PreferenceBatch", "PreferenceTask", "dpo_loss", "pair_logps"]
