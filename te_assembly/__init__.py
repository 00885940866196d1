"""te_assembly: configuration-driven model assembly for Transformer Engine fusible ops and channels.

Importing this package is cheap and never imports torch or TE; ``build`` pulls them in when called.
``load`` runs the config pipeline (``pipeline.py``) without either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from te_assembly.lazy import lazy_attributes
from te_assembly.version import __version__

if TYPE_CHECKING:
    from te_assembly.analysis.pipeline import load, validate_model
    from te_assembly.config.locations import configs_dir, shipped_config
    from te_assembly.engines import build
    from te_assembly.jobs.pretrained import export_checkpoint, from_pretrained, save_pretrained

_LAZY = {
    "build": "te_assembly.engines",
    "load": "te_assembly.analysis.pipeline",
    "validate_model": "te_assembly.analysis.pipeline",
    "shipped_config": "te_assembly.config.locations",
    "configs_dir": "te_assembly.config.locations",
    "save_pretrained": "te_assembly.jobs.pretrained",
    "from_pretrained": "te_assembly.jobs.pretrained",
    "export_checkpoint": "te_assembly.jobs.pretrained",
}


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = [
    "__version__",
    "build",
    "configs_dir",
    "export_checkpoint",
    "from_pretrained",
    "load",
    "save_pretrained",
    "shipped_config",
    "validate_model",
]
