"""te_assembly: configuration-driven model assembly for Transformer Engine fusible ops and channels.

Importing this package is cheap and never imports torch or TE; ``build`` and the jobs pull them in when
called. ``load`` runs the config pipeline (``analysis/pipeline.py``) without either.

The jobs (``jobs/``) are functions of a plan, a ``Target`` and their settings: ``run``, ``verify``,
``train`` and ``bench``, with ``RunSettings``, ``TrainSettings`` and ``BenchSettings`` (a language
model's ``train`` also takes ``DataSettings``); ``generate`` continues a prompt with a language model
(``GenerateSettings``). ``from_hf``, ``import_hf`` and ``to_hf`` bring Hugging Face checkpoints in and
out (``te_assembly.hf`` has the name mapping).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from te_assembly.lazy import lazy_attributes
from te_assembly.version import __version__

if TYPE_CHECKING:
    from te_assembly.analysis.pipeline import load, validate_model
    from te_assembly.analysis.settings import RunSettings
    from te_assembly.config.locations import configs_dir, shipped_config
    from te_assembly.engines import build
    from te_assembly.jobs.bench import bench
    from te_assembly.jobs.benchmark.settings import BenchSettings
    from te_assembly.jobs.generate import generate
    from te_assembly.jobs.hf.convert import from_hf, import_hf, to_hf
    from te_assembly.jobs.pretrained import (
        export_checkpoint,
        from_checkpoint,
        from_pretrained,
        save_pretrained,
    )
    from te_assembly.jobs.run import run
    from te_assembly.jobs.target import Target
    from te_assembly.jobs.text.settings import DataSettings, GenerateSettings
    from te_assembly.jobs.train import train
    from te_assembly.jobs.training.settings import TrainSettings
    from te_assembly.jobs.verify import verify

_LAZY = {
    "build": "te_assembly.engines",
    "load": "te_assembly.analysis.pipeline",
    "validate_model": "te_assembly.analysis.pipeline",
    "shipped_config": "te_assembly.config.locations",
    "configs_dir": "te_assembly.config.locations",
    "save_pretrained": "te_assembly.jobs.pretrained",
    "from_pretrained": "te_assembly.jobs.pretrained",
    "export_checkpoint": "te_assembly.jobs.pretrained",
    "from_checkpoint": "te_assembly.jobs.pretrained",
    "generate": "te_assembly.jobs.generate",
    "from_hf": "te_assembly.jobs.hf.convert",
    "import_hf": "te_assembly.jobs.hf.convert",
    "to_hf": "te_assembly.jobs.hf.convert",
    "DataSettings": "te_assembly.jobs.text.settings",
    "GenerateSettings": "te_assembly.jobs.text.settings",
    "Target": "te_assembly.jobs.target",
    "run": "te_assembly.jobs.run",
    "verify": "te_assembly.jobs.verify",
    "train": "te_assembly.jobs.train",
    "bench": "te_assembly.jobs.bench",
    "RunSettings": "te_assembly.analysis.settings",
    "TrainSettings": "te_assembly.jobs.training.settings",
    "BenchSettings": "te_assembly.jobs.benchmark.settings",
}


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = [
    "BenchSettings",
    "DataSettings",
    "GenerateSettings",
    "RunSettings",
    "Target",
    "TrainSettings",
    "__version__",
    "bench",
    "build",
    "configs_dir",
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
    "validate_model",
    "verify",
]
