"""The ``train:`` config block as a checked dataclass. Bad values become diagnostics, not tracebacks.

Each field's ``setting(...)`` is its schema (type from the annotation, rules, one line of doc): the
checker (``sections``), ``train --help`` and the run record all read it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from te_assembly.analysis.head import CHUNK_TOKENS
from te_assembly.diagnostics import error
from te_assembly.errors import ConfigError
from te_assembly.fields import FieldSpec
from te_assembly.sections import read_section, setting, subsection

OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("constant", "cosine")
NAN_TARGETS = ("loss", "grad")

TEACHER_BATCH, TEACHER_SEQ_LEN = 256, 32
"""The teacher task's batch (rows) and sequence length when ``batch_tokens``/``seq_len`` are null."""
LM_SEQUENCES, LM_SEQ_LEN = 32, 128
"""A language model's: 32 sequences of 128 tokens."""

# The teacher is seeded with seed + offset; seeds are < 2**63 and torch takes seeds below 2**64.
_MAX_TEACHER_OFFSET = 2**63


DPO_LOSSES = ("sigmoid", "ipo", "simpo")


@dataclass(frozen=True)
class DPOSettings:
    """``train.dpo``: direct preference optimisation (``train.objective=dpo``)."""

    beta: float = setting(
        0.1, minimum=0, exclusive_minimum=True, doc="how far from the reference the policy may move"
    )
    loss: str = setting(
        "sigmoid",
        choices=DPO_LOSSES,
        doc="sigmoid: DPO's -log sigmoid(beta * margin); ipo: IPO's (margin - 1 / (2 beta))^2 on mean "
        "log-probabilities; simpo: SimPO's reference-free -log sigmoid(beta * (mean chosen - mean rejected "
        "log-probability) - gamma)",
    )
    simpo_gamma: float = setting(0.5, minimum=0, doc="loss=simpo: the target margin gamma")


@dataclass(frozen=True)
class TrainSettings:
    """``train:``: the run (steps, batch, optimizer, schedule), its directory, checkpoints and resume."""

    steps: int = setting(200, minimum=1, doc="optimizer steps (the schedule spans them)")
    epochs: float | None = setting(
        None,
        minimum=0,
        exclusive_minimum=True,
        doc="language models: passes over the training split instead of a step count (each sequence or "
        "conversation once per pass, in a seeded order); the steps follow from it and train.steps is not "
        "read (null: train.steps)",
    )
    batch_tokens: int | None = setting(
        None,
        minimum=1,
        doc=f"rows of x per step, for all micro-batches together (null: {TEACHER_BATCH}; a language model: "
        f"{LM_SEQUENCES} sequences of seq_len tokens)",
    )
    seq_len: int | None = setting(
        None,
        minimum=1,
        doc=f"positions per sequence when the model takes sequences (null: {TEACHER_SEQ_LEN}; a language "
        f"model: {LM_SEQ_LEN})",
    )
    grad_accum: int = setting(1, minimum=1, doc="micro-batches per optimizer step (batch_tokens is split)")
    clip_grad_norm: float | None = setting(
        None,
        minimum=0,
        exclusive_minimum=True,
        doc="clip the gradients' total norm to this before each step (null: off)",
    )
    z_loss: float = setting(0.0, minimum=0, doc="language models: weight of the z-loss (logsumexp^2) term")
    mtp_weight: float = setting(
        0.1,
        minimum=0,
        doc="language models with multi-token prediction modules (AheadLogits steps, as DeepSeek-V3's and "
        "GLM-4.5's import): their loss weight, DeepSeek-V3's lambda (the mean of the modules' "
        "cross-entropies times it); 0: they are not trained",
    )
    objective: str = setting(
        "lm",
        choices=("lm", "dpo"),
        doc="language models: lm, next-token cross-entropy; dpo, preference tuning on data.format=preference "
        "pairs against the starting weights (train.dpo)",
    )
    dpo: DPOSettings = subsection(DPOSettings, doc="train.objective=dpo's loss")
    eval_every: int = setting(
        50, minimum=0, doc="language models: validation loss every this many steps, and at the end (0: end)"
    )
    eval_batches: int = setting(8, minimum=1, doc="language models: validation batches per evaluation")
    optimizer: str = setting("adamw", choices=OPTIMIZERS, doc="the optimizer")
    lr: float = setting(3e-3, minimum=0, doc="peak learning rate")
    weight_decay: float = setting(0.0, minimum=0, doc="decoupled weight decay (adamw) or L2 (sgd)")
    momentum: float = setting(0.9, minimum=0, doc="sgd only")
    schedule: str = setting("cosine", choices=SCHEDULES, doc="both after a linear warm-up")
    warmup_steps: int = setting(10, minimum=0, doc="linear warm-up steps")
    min_lr_ratio: float = setting(0.1, minimum=0, doc="cosine decays to lr * min_lr_ratio")
    teacher_seed_offset: int = setting(
        1, minimum=0, maximum=_MAX_TEACHER_OFFSET, doc="teacher seed = seed + offset"
    )
    out_dir: str | None = setting(
        None,
        nonempty=True,
        doc="where the run's files go (null: the run directory, outputs/<model>/<date>_<time>)",
    )
    checkpoint_every: int = setting(50, minimum=0, doc="also at the last step; 0 = only at the last step")
    keep_checkpoints: int = setting(2, minimum=1, doc="checkpoints kept in out_dir")
    resume: bool | str = setting(
        False,
        nonempty=True,
        doc="true: continue this model's newest run that has checkpoints; auto: continue this run's own "
        "directory (train.out_dir or hydra.run.dir) when it holds a checkpoint, else start fresh there (the "
        "one command for a first start and every restart); a run directory (or a checkpoint in one): "
        "continue that run (refused if the run's settings differ)",
    )
    overwrite: bool = setting(
        False, doc="replace an earlier run in out_dir (deleted after the new run's first checkpoint)"
    )
    resume_from: str | None = setting(
        None, nonempty=True, doc="with resume: this checkpoint of out_dir instead of the newest"
    )
    init_from: str | None = setting(
        None,
        nonempty=True,
        doc="start from the weights of this pretrained directory (save_pretrained, export, import-hf) "
        "instead of a random init; its model must be this one",
    )
    activation_checkpointing: str = setting(
        "none",
        choices=("none", "blocks", "all"),
        doc="recompute activations in backward instead of keeping them: blocks, each block use (TE "
        "engine: each fuser; a model without blocks: the whole forward); all, every step",
    )
    loss_chunk_tokens: int | None = setting(
        CHUNK_TOKENS,
        minimum=1,
        doc="language models: compute the vocabulary head and the loss this many tokens at a time, so the "
        "batch's logits never exist whole (the next-token loss takes each chunk's gradient at once; DPO "
        "recomputes each chunk in backward); null: whole",
    )
    plot: bool = setting(True, doc="write loss_curve.png")
    loggers: list[str] | None = setting(
        None,
        items=FieldSpec(str, choices=("tensorboard", "wandb", "mlflow")),
        single_as_list=True,
        doc="where per-step scalars go besides metrics.jsonl: tensorboard (<run dir>/tensorboard), wandb "
        "(<run dir>/wandb; WANDB_MODE=offline keeps it there), mlflow (<run dir>/mlflow.db, or "
        "MLFLOW_TRACKING_URI); each named one must be installed (null: tensorboard where installed; []: "
        "none)",
    )
    log_every: int = setting(
        1, minimum=1, doc="when output is not a terminal: one plain line every this many steps (and the last)"
    )
    async_checkpoint: bool = setting(
        False,
        doc="write checkpoints in the background (DCP's async_save, as sharded .dcp directories): the step "
        "waits only for the state's copy to host memory; a checkpoint counts once complete",
    )
    stop_after: int | None = setting(
        None, minimum=1, doc="stop (with a checkpoint) after this step, as if interrupted"
    )
    inject_nan_at_step: int | None = setting(None, minimum=1, doc="testing aid: force a NaN at this step")
    inject_nan_into: str = setting(
        "loss", choices=NAN_TARGETS, doc="testing aid: into the loss or a gradient"
    )

    def __post_init__(self) -> None:
        if self.resume_from and not self.resume:
            raise ConfigError(
                [
                    error(
                        "train.resume_from",
                        "conflicting-settings",
                        "train.resume_from names a checkpoint to resume from: set train.resume=true too",
                    )
                ]
            )
        if isinstance(self.resume, str) and self.resume != "auto" and self.out_dir is not None:
            raise ConfigError(
                [
                    error(
                        "train.resume",
                        "conflicting-settings",
                        f"train.resume={self.resume} names the run to continue, and so does train.out_dir="
                        f"{self.out_dir}: give only one (train.resume=true continues train.out_dir)",
                    )
                ]
            )
        if self.resume and self.overwrite:
            raise ConfigError(
                [
                    error(
                        "train.overwrite",
                        "conflicting-settings",
                        "train.resume and train.overwrite are both true: resume continues the run in "
                        "out_dir, overwrite deletes it; set only one",
                    )
                ]
            )

    def for_task(self, language_model: bool) -> TrainSettings:
        """These settings with ``batch_tokens`` and ``seq_len`` decided (their null means the task's
        default): what the run uses and records."""
        seq_len = self.seq_len or (LM_SEQ_LEN if language_model else TEACHER_SEQ_LEN)
        batch = self.batch_tokens or (LM_SEQUENCES * seq_len if language_model else TEACHER_BATCH)
        return dataclasses.replace(self, seq_len=seq_len, batch_tokens=batch)

    @property
    def tokens(self) -> int:
        """``batch_tokens`` once decided (``for_task``)."""
        assert self.batch_tokens is not None, "TrainSettings.for_task decides batch_tokens first"
        return self.batch_tokens

    @property
    def positions(self) -> int:
        """``seq_len`` once decided (``for_task``)."""
        assert self.seq_len is not None, "TrainSettings.for_task decides seq_len first"
        return self.seq_len

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], prefix: str = "train") -> TrainSettings:
        """Check every key at once; raise ``ConfigError`` listing all problems."""
        return read_section(cls, raw, prefix)


RESUMABLE = (
    "steps",
    "activation_checkpointing",
    "stop_after",
    "checkpoint_every",
    "keep_checkpoints",
    "plot",
    "eval_every",
    "eval_batches",
)
"""Settings a resumed run may change (a changed ``steps`` reshapes the cosine schedule: noted)."""
NOT_RECORDED = (
    "out_dir",
    "loss_chunk_tokens",
    "async_checkpoint",
    "resume",
    "overwrite",
    "resume_from",
    "loggers",
    "log_every",
    "inject_nan_at_step",
    "inject_nan_into",
)
"""Where and how this invocation runs, not what the run is. Every other setting defines the run: a
checkpoint records them and a resume must match (a new setting is run-defining unless listed)."""
ADDED_LATER = {
    "grad_accum": 1,
    "clip_grad_norm": None,
    "z_loss": 0.0,
    "mtp_weight": 0.1,
    "init_from": None,
    "epochs": None,
    "objective": "lm",
    "dpo": {"beta": 0.1, "loss": "sigmoid", "simpo_gamma": 0.5},
}
"""Run-defining settings newer than the checkpoint format, with their default: recorded only when set
otherwise, so a run recorded before they existed (which ran with the default) still resumes."""
