"""te_assembly: configuration-driven model assembly for Transformer Engine fusible ops and channels.

Importing this package is cheap and never imports torch or TE; ``build`` and the jobs pull them in when
called. ``load`` runs the config pipeline (``analysis/pipeline.py``) without either.

Every job has one shape, ``job(plan_or_model, target, settings, *, on_event=...)``: ``run``, ``verify``,
``train`` and ``bench`` take a plan, ``generate`` a model (or a directory to load one from), and each
a ``Target`` (engine, kernels, device, dtype, recipe, seed, parallel layout; an engine name stands for
``Target.of(name)``) and its settings (``RunSettings``, ``TrainSettings`` with ``data=DataSettings``
for a language model, ``BenchSettings``, ``GenerateSettings``). The loaders take a target too:
``build``, ``from_pretrained``, ``from_checkpoint``, ``from_hf``. ``import_hf`` and ``to_hf`` bring Hugging
Face checkpoints in and out (``te_assembly.hf`` has the name mapping).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from te_assembly import display
from te_assembly.lazy import lazy_attributes
from te_assembly.version import __version__

if TYPE_CHECKING:
    from te_assembly.analysis.pipeline import load, validate_model
    from te_assembly.analysis.settings import RunSettings
    from te_assembly.config.locations import configs_dir, shipped_config
    from te_assembly.data.settings import DataSettings
    from te_assembly.engines import build
    from te_assembly.engines.reference.attention import twice_differentiable
    from te_assembly.engines.target import Target
    from te_assembly.formats.hf.convert import from_hf, import_hf, to_hf
    from te_assembly.formats.pretrained import (
        export_checkpoint,
        from_checkpoint,
        from_pretrained,
        save_pretrained,
    )
    from te_assembly.jobs.bench.job import bench
    from te_assembly.jobs.bench.settings import BenchSettings
    from te_assembly.jobs.eval.settings import EvalSettings
    from te_assembly.jobs.generate.job import generate
    from te_assembly.jobs.generate.settings import GenerateSettings
    from te_assembly.jobs.harness.run import evaluate_tasks
    from te_assembly.jobs.run import run
    from te_assembly.jobs.train.job import train
    from te_assembly.jobs.train.settings import TrainSettings
    from te_assembly.jobs.verify import verify

_LAZY = {
    "build": "te_assembly.engines",
    "load": "te_assembly.analysis.pipeline",
    "validate_model": "te_assembly.analysis.pipeline",
    "shipped_config": "te_assembly.config.locations",
    "configs_dir": "te_assembly.config.locations",
    "save_pretrained": "te_assembly.formats.pretrained",
    "from_pretrained": "te_assembly.formats.pretrained",
    "export_checkpoint": "te_assembly.formats.pretrained",
    "from_checkpoint": "te_assembly.formats.pretrained",
    "from_hf": "te_assembly.formats.hf.convert",
    "import_hf": "te_assembly.formats.hf.convert",
    "to_hf": "te_assembly.formats.hf.convert",
    "DataSettings": "te_assembly.data.settings",
    "GenerateSettings": "te_assembly.jobs.generate.settings",
    "Target": "te_assembly.engines.target",
    "run": "te_assembly.jobs.run",
    "verify": "te_assembly.jobs.verify",
    "train": "te_assembly.jobs.train.job",
    "bench": "te_assembly.jobs.bench.job",
    "generate": "te_assembly.jobs.generate.job",
    "RunSettings": "te_assembly.analysis.settings",
    "TrainSettings": "te_assembly.jobs.train.settings",
    "BenchSettings": "te_assembly.jobs.bench.settings",
    "EvalSettings": "te_assembly.jobs.eval.settings",
    "evaluate_tasks": "te_assembly.jobs.harness.run",
    "twice_differentiable": "te_assembly.engines.reference.attention",
}


__getattr__ = lazy_attributes(__name__, _LAZY)


def _views() -> Any:
    """What the engines and jobs ask the views for (a model's summary and picture, a run's loss curve),
    wired here at the top because they sit below the views (``display.py``)."""
    from te_assembly.views import provided

    return provided


display.provide(_views)


__all__ = [
    "BenchSettings",
    "DataSettings",
    "EvalSettings",
    "GenerateSettings",
    "RunSettings",
    "Target",
    "TrainSettings",
    "__version__",
    "bench",
    "build",
    "configs_dir",
    "evaluate_tasks",
    "export_checkpoint",
    "from_checkpoint",
    "from_hf",
    "from_pretrained",
    "generate",
    "import_hf",
    "load",
    "run",
    "save_pretrained",
    "shipped_config",
    "to_hf",
    "train",
    "twice_differentiable",
    "validate_model",
    "verify",
]
