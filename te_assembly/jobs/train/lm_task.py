"""A language model's task: next-token prediction on a tokenized corpus (``te_assembly/data/``).

Each step's batch is a pure function of (seed, step) (``Corpus.batch``), so a resumed run sees exactly
the data an uninterrupted one would; validation reads the same held-out windows every time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from te_assembly.analysis.plan import Plan
from te_assembly.data.batch_seeds import epoch_units
from te_assembly.data.cache import Progress, prepare
from te_assembly.data.corpus import Corpus, bits_per_byte
from te_assembly.data.settings import DataSettings
from te_assembly.diagnostics import error
from te_assembly.engines.base import ahead_outputs
from te_assembly.engines.head_chunks import TokenReduction, reduced_logits
from te_assembly.engines.reference.packing import packed
from te_assembly.engines.target import Target
from te_assembly.errors import ConfigError
from te_assembly.jobs import objective
from te_assembly.jobs.train.task import Batch


def check_language_model(plan: Plan) -> None:
    """``ConfigError`` unless ``plan`` maps token ids to logits over its own vocabulary."""
    if plan.out_features != plan.in_features:
        raise ConfigError(
            [
                error(
                    "model",
                    "not-a-language-model",
                    f"{plan.name} takes token ids of a vocabulary of {plan.in_features} but returns "
                    f"{plan.out_features} features: next-token training needs logits over the vocabulary",
                    f"end the model in a Linear with out_features: {plan.in_features} (the vocabulary head)",
                )
            ]
        )


def uses_fused_cross_entropy(target: Target) -> bool:
    """TE's fused cross-entropy (a Triton kernel) with TE's kernels on a GPU; torch's elsewhere."""
    return target.engine == "te" and target.kernels == "te" and target.device.type == "cuda"


@dataclass
class Evaluation:
    loss: float
    """Mean next-token cross-entropy (nats per token) over the validation windows."""
    tokens: int
    bits_per_byte: float | None

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.loss, 700.0))

    def metrics(self) -> dict[str, Any]:
        return {
            "val_loss": self.loss,
            "val_perplexity": self.perplexity,
            "val_bits_per_byte": self.bits_per_byte,
        }


class LanguageTask:
    """Batches ``(token ids, {}, next-token labels)``; the objective is next-token cross-entropy plus
    every loss output (router aux losses), with an optional z-loss."""

    is_language_model = True

    def __init__(
        self,
        plan: Plan,
        corpus: Corpus,
        target: Target,
        *,
        tokens: int,
        z_loss: float = 0.0,
        mtp_weight: float = 0.0,
        chunk_tokens: int | None = None,
    ) -> None:
        check_language_model(plan)
        corpus.check_fits(plan.in_features, plan.name)
        self.plan, self.corpus, self.target, self.z_loss = plan, corpus, target, z_loss
        self.chunk_tokens = chunk_tokens
        """``train.loss_chunk_tokens``: the logits and the loss computed this many tokens at a time
        (``engines/head_chunks.py``); None: whole."""
        self.mtp_weight, self.ahead = mtp_weight, ahead_outputs(plan)
        self.sequences = tokens // corpus.seq_len
        self.fused = uses_fused_cross_entropy(target)

    @classmethod
    def prepare(
        cls,
        plan: Plan,
        data: DataSettings,
        target: Target,
        *,
        tokens: int,
        seq_len: int,
        z_loss: float = 0.0,
        mtp_weight: float = 0.0,
        chunk_tokens: int | None = None,
        progress: Progress | None = None,
    ) -> LanguageTask:
        check_language_model(plan)
        loss = {"z_loss": z_loss, "mtp_weight": mtp_weight, "chunk_tokens": chunk_tokens}
        if data.format == "chat":
            from te_assembly.data.conversations import ChatCorpus

            chat = ChatCorpus.prepare(data, seq_len)
            return cls(plan, chat, target, tokens=tokens, **loss)  # type: ignore[arg-type]
        corpus = Corpus(prepare(data, progress), seq_len, data.packing)
        return cls(plan, corpus, target, tokens=tokens, **loss)  # type: ignore[arg-type]

    def record(self, data: DataSettings) -> dict[str, Any]:
        """What the run record keeps of the data: a resume on other text or tokenizer is another run."""
        settings = {k: v for k, v in dataclasses.asdict(data).items() if k != "cache_dir"}
        meta = self.corpus.data.meta
        return {
            "settings": settings,
            "sources_sha256": meta["sources_sha256"],
            "tokenizer": meta["tokenizer"],
        }

    epochs: float | None = None
    """``train.epochs``: batches walk the training split pass after pass (``epoch_units``) instead of
    drawing random windows."""

    def steps_for(self, epochs: float) -> int:
        """Optimizer steps of ``epochs`` passes over the training split (the last batch of a pass
        spilling into the next), and from now on each batch walks the passes."""
        self.epochs = epochs
        return max(1, math.ceil(epochs * self.corpus.units / self.units_per_step))

    @property
    def units_per_step(self) -> int:
        """Units of the corpus a step takes (a preference pair is two rows)."""
        return max(1, self.sequences // getattr(self.corpus, "rows_per_unit", 1))

    def batch(self, step: int, micro: int = 0, micros: int = 1) -> Batch:
        sequences = self.sequences // micros
        if self.epochs is not None:
            per_micro = max(1, self.units_per_step // micros)
            first = (step - 1) * self.units_per_step + micro * per_micro
            units = epoch_units(self.target.seed, self.corpus.units, first, per_micro)
            rows = self.corpus.rows_of(units)
        else:
            rows = self.corpus.batch(self.target.seed, step, sequences, micro)
        # (x, labels), and packed rows' documents (``data.packing``)
        x, labels, *documents = (t.to(self.target.device) for t in rows)
        if self.target.is_parallel:
            assert self.target.parallel is not None
            local = self.target.parallel.local_rows
            x, labels, documents = local(x), local(labels), [local(d) for d in documents]
        return Batch(x, {}, labels, documents[0] if documents else None)

    def reduction(self, labels: torch.Tensor, summed: bool = True) -> TokenReduction | None:
        """What the loss keeps of the logits for ``labels``, computed chunk by chunk (``chunk_tokens``;
        ``summed``: see ``objective.next_token_reduction``); None: the logits whole."""
        if self.chunk_tokens is None:
            return None
        return objective.next_token_reduction(
            labels, self.chunk_tokens, z_loss=self.z_loss, fused=self.fused, summed=summed
        )

    def head_request(self, batch: Batch) -> TokenReduction | None:
        """The training step's ``reduction`` of ``batch``'s labels."""
        return self.reduction(batch.target)

    def terms(
        self, y: torch.Tensor, extras: Mapping[str, torch.Tensor], batch: Batch, loss_names: Sequence[str]
    ) -> dict[str, torch.Tensor]:
        return objective.next_token_terms(
            y,
            batch.target,
            extras,
            loss_names,
            z_loss=self.z_loss,
            fused=self.fused,
            ahead=self.ahead,
            mtp_weight=self.mtp_weight,
            documents=batch.documents,
            reduced=self.chunk_tokens is not None,
        )

    def evaluate(self, model: torch.nn.Module, batches: int) -> Evaluation | None:
        """Validation cross-entropy (None without a validation split)."""
        if not self.corpus.has_validation:
            return None
        was_training = model.training
        model.eval()
        total, count = 0.0, 0
        try:
            with torch.no_grad():
                for rows in self.corpus.eval_batches(batches, self.sequences):
                    x, labels, *documents = (t.to(self.target.device) for t in rows)
                    asked = self.reduction(labels)
                    with packed(model, documents[0] if documents else None), reduced_logits(model, asked):
                        y, _ = model(x)
                    ce = objective.next_token_terms(
                        y, labels, {}, (), fused=self.fused, reduced=asked is not None
                    )[objective.CROSS_ENTROPY]
                    labelled = int((labels != objective.IGNORE_INDEX).sum())
                    total += float(ce) * labelled
                    count += labelled
        finally:
            model.train(was_training)
        loss = total / max(count, 1)
        return Evaluation(loss, count, bits_per_byte(loss, self.corpus.val_bytes_per_token))


__all__ = ["Evaluation", "LanguageTask", "check_language_model", "uses_fused_cross_entropy"]
