"""What the layers below ask the views for, through ``te_assembly.display`` (they cannot import the
views): a built model's summary and picture (``model.summary()``, ``model.plot()``) and a training run's
loss curve (``train.plot``)."""

from __future__ import annotations

from te_assembly.views.loss_curve import draw_run
from te_assembly.views.model import plot, summary

__all__ = ["draw_run", "plot", "summary"]
