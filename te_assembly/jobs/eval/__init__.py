"""The ``eval`` job: a language model's loss, perplexity and bits per byte on a text (``job.py``), with
its ``eval:`` settings (``settings.py``, pure Python). Names are resolved on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from te_assembly.lazy import lazy_attributes

if TYPE_CHECKING:
    from te_assembly.jobs.eval.job import Evaluated, evaluate, score
    from te_assembly.jobs.eval.settings import EvalSettings

__getattr__ = lazy_attributes(
    __name__,
    {
        "evaluate": "te_assembly.jobs.eval.job",
        "score": "te_assembly.jobs.eval.job",
        "Evaluated": "te_assembly.jobs.eval.job",
        "EvalSettings": "te_assembly.jobs.eval.settings",
    },
)

__all__ = ["EvalSettings", "Evaluated", "evaluate", "score"]
