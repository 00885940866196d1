"""The loss curve as a PNG (matplotlib's Agg backend: no display needed): drawn from what the ``train``
job returns, by the CLI and by ``te_assembly.train``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from te_assembly.files.write import write_atomic


def save_loss_curve(
    losses: Sequence[float],
    path: Path,
    title: str,
    resumed_at: int | None = None,
    validation: Sequence[tuple[int, float]] = (),
) -> Path:
    """Plot loss against 1-based step (log scale when every loss is positive), and ``validation``
    (step, loss) points on the same axes when given."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    # A bare Figure (not pyplot) keeps no global state between calls.
    fig = Figure(figsize=(7, 4), dpi=110)
    ax = fig.add_subplot()
    steps = range(1, len(losses) + 1)
    ax.plot(steps, losses, linewidth=1.2, label="training loss" if validation else "loss")
    if validation:
        ax.plot(*zip(*validation, strict=True), marker="o", linewidth=1.2, label="validation loss")
    if resumed_at is not None:
        ax.axvline(resumed_at + 0.5, color="tab:red", linestyle=":", label=f"resumed after step {resumed_at}")
    if losses and all(v > 0 for v in [*losses, *(v for _, v in validation)]):
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, format="png"))
    return path


def draw_run(result: Any) -> Path | None:
    """A ``train`` result's curve as ``loss_curve.png`` in its run directory (its ``plot``), drawn by the
    process that writes the run's files; None when there is nothing to draw."""
    if not result.losses or not result.is_main:
        return None
    what = "next-token cross-entropy" if result.language_model else "teacher regression"
    title = f"{result.model_name}: {what} ({result.engine} engine)"
    validation = [(step, e["val_loss"]) for step, e in result.evaluations]
    resumed = result.start_step or None
    result.plot = save_loss_curve(
        result.losses, result.out_dir / "loss_curve.png", title, resumed, validation
    )
    return result.plot
