"""What the ``train`` job reports: an event as the run starts, one ``StepRecord`` per step, ``Stopped``
when a signal ends it, and the ``TrainResult`` it returns. Data only: the CLI (and ``te_assembly.train``)
turn them into lines, a progress bar and the loss-curve picture."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Started:
    """The run's directory is decided and every check before building passed: training starts."""

    out_dir: Path
    notes: tuple[str, ...] = ()
    """What to tell the user about the directory's choice (``run_dir.choose``)."""


@dataclass(frozen=True)
class StepRecord:
    step: int
    """1-based."""
    end: int
    """The step this run stops after."""
    loss: float
    terms: dict[str, float]
    lr: float
    seconds: float
    """Student forward + backward + optimizer step (the teacher's forward is data, not timed)."""
    tokens_per_s: float
    grad_norm: float = float("nan")
    """The whole model's gradient norm before the optimizer step."""
    wall_time: float = 0.0
    """Seconds since the epoch when the step ended."""
    elapsed_s: float = 0.0
    """Seconds since this invocation started training."""
    evaluation: dict[str, Any] | None = None
    """A language model's validation after this step (``val_loss``, ``val_perplexity``,
    ``val_bits_per_byte``), on the steps it is evaluated."""
    measures: dict[str, float] = field(default_factory=dict)
    """What the task measures beside the loss (DPO: ``rewards/chosen``, ``rewards/rejected``,
    ``rewards/margin``, ``rewards/accuracy``)."""

    def metrics(self) -> dict[str, Any]:
        """The record ``metrics.jsonl`` keeps (``metrics.py``)."""
        return {
            **(self.evaluation or {}),
            "step": self.step,
            "loss": self.loss,
            "terms": dict(self.terms),
            "lr": self.lr,
            "grad_norm": self.grad_norm,
            "tokens_per_s": self.tokens_per_s,
            "step_time_s": self.seconds,
            "wall_time": self.wall_time,
            "elapsed_s": self.elapsed_s,
            **({"measures": dict(self.measures)} if self.measures else {}),
        }


@dataclass(frozen=True)
class Stopped:
    """A signal (Ctrl-C, SIGTERM) ended the run: what it keeps, on the main rank (``kept``: the newest
    verified checkpoint and its step; None when it stopped before the first)."""

    out_dir: Path
    kept: tuple[Path, int] | None


@dataclass
class TrainResult:
    model_name: str
    engine: str
    language_model: bool
    out_dir: Path
    losses: list[float]
    """Loss of every step so far, including steps before a resume: ``losses[i]`` is step ``i + 1``."""
    start_step: int
    """Steps already done when this run started (0 unless resumed)."""
    last_step: int
    is_main: bool = True
    """This process writes the run's files (rank 0 of a parallel run)."""
    checkpoints: list[Path] = field(default_factory=list)
    metrics_file: Path | None = None
    """``metrics.jsonl``: one record per step (``metrics.py``)."""
    trackers: tuple[str, ...] = ()
    """Where its per-step scalars went besides ``metrics_file`` (``train.loggers``)."""
    config_file: Path | None = None
    plot: Path | None = None
    """``loss_curve.png``, once drawn (``views/loss_curve.py``; ``train.plot``)."""
    notes: list[str] = field(default_factory=list)
    model: Any = None
    """The trained model (an ``AssembledModel``)."""
    evaluations: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    """A language model's validation results by step, this invocation's and (resumed) the earlier ones
    ``metrics.jsonl`` holds."""
    tokenizer_file: Path | None = None
    """``tokenizer.json`` beside the run (a tokenizer file or a trained BPE; byte-level needs none)."""
    files_held: bool = False
    """``train.overwrite``: this run wrote no checkpoint, so the earlier run's files are still the
    directory's (and this run's metrics and picture are not written)."""


__all__ = ["Started", "StepRecord", "Stopped", "TrainResult"]
