"""A training run in words: what runs (before the progress bar), each validation, what a stopped run
keeps and how to continue it, and what the run wrote; lines for the CLI, from the ``train`` job's
events and result."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from te_assembly.diagnostics import printable


def run_lines(plan: Any, settings: Any, target: Any, data: Any, started: Any) -> list[str]:
    """The notes about the directory's choice, the directory, the parallel layout and the task."""
    lines = [*started.notes, f"run directory: {printable(str(started.out_dir))}"]
    if target.parallel is not None:
        layout = target.parallel.settings.describe()
        lines.append(f"parallel: {layout}; each rank trains on its rows of every batch")
    teacher = f"regress a teacher (seed {target.seed + settings.teacher_seed_offset})"
    task = f"next-token cross-entropy on {data_words(data)}" if plan.takes_token_ids else teacher
    lines.append(
        f"{printable(plan.name)}: {task} for {settings.steps} steps of {settings.batch_tokens} tokens; "
        f"{settings.optimizer} lr {settings.lr:g} ({settings.schedule}, warm-up {settings.warmup_steps}), "
        f"device {target.device}, dtype {target.dtype_name}"
    )
    return lines


def data_words(data: Any) -> str:
    """A language model's text and tokenizer (the ``data:`` section) in words."""
    from te_assembly.data.sources import DEFAULT_CORPUS

    where = f"data.path={data.path}" if data.path is not None else DEFAULT_CORPUS
    tok = data.tokenizer
    how = {
        "byte": "byte-level",
        "file": f"tokenizer {tok.path}",
        "bpe": f"a BPE of {tok.train_vocab} trained on it",
    }
    return f"{where} ({how[tok.kind]})"


def evaluation_line(step: int, evaluation: dict[str, Any]) -> str:
    bpb = evaluation.get("val_bits_per_byte")
    loss, perplexity = evaluation["val_loss"], evaluation["val_perplexity"]
    line = f"step {step}: validation loss {loss:.4f}, perplexity {perplexity:.2f}"
    return line + (f", {bpb:.3f} bits per byte" if isinstance(bpb, float) else "")


def kept_lines(stopped: Any, overrides: Sequence[str]) -> list[str]:
    """After an interrupt: the checkpoint the run keeps and the command that continues from it
    (``overrides``: the stopped command's own)."""
    if stopped.kept is None:
        return [f"stopped before the first checkpoint: nothing of this run is kept in {stopped.out_dir}"]
    path, step = stopped.kept
    kept = [o for o in overrides if not o.lstrip("+~").startswith(("train.resume", "hydra.run.dir"))]
    command = " ".join(["python -m te_assembly train", *kept, f"train.resume={stopped.out_dir}"])
    return [f"stopped: the run keeps {path} (step {step}, verified); continue it with", f"  {command}"]


def result_lines(result: Any) -> list[str]:
    """The loss at the start and end, every file written, where the TensorBoard events are."""
    lines = []
    losses = result.losses
    if losses:
        head, tail = losses[: min(5, len(losses))], losses[-min(5, len(losses)) :]
        lines.append(
            f"loss: first {sum(head) / len(head):.4g} (mean of {len(head)}), "
            f"last {sum(tail) / len(tail):.4g} (mean of {len(tail)}) after step {result.last_step}"
        )
    files = (
        *result.checkpoints[-1:],
        result.config_file,
        result.metrics_file,
        result.tokenizer_file,
        result.plot,
    )
    lines += [f"wrote {p}" for p in files if p is not None]
    out = Path(result.out_dir)
    if "tensorboard" in result.trackers:
        lines.append(f"TensorBoard events in {out / 'tensorboard'} (tensorboard --logdir {out.parent})")
    if "wandb" in result.trackers:
        lines.append(f"W&B run in {out / 'wandb'} (offline runs: wandb sync {out / 'wandb'}/offline-run-*)")
    if "mlflow" in result.trackers:
        where = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{out / 'mlflow.db'}"
        lines.append(f"MLflow run in {where} (mlflow ui --backend-store-uri {where})")
    return lines


def step_line(record: Any) -> str:
    """One step as a plain line, for output that is not a terminal (a log file, CI)."""
    width = len(str(record.end))
    elapsed = int(record.elapsed_s)
    clock = f"{elapsed // 3600}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d}"
    measures = "".join(f"  {name} {value:.4g}" for name, value in (record.measures or {}).items())
    return (
        f"step {record.step:>{width}}/{record.end}  loss {record.loss:.4g}  lr {record.lr:.3g}  "
        f"grad_norm {record.grad_norm:.3g}  {record.tokens_per_s:,.0f} tok/s  {clock}{measures}"
    )


__all__ = ["data_words", "evaluation_line", "kept_lines", "result_lines", "run_lines", "step_line"]
