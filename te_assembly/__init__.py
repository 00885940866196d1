"""te_assembly: configuration-driven model assembly for Transformer Engine fusible ops and channels.

Importing this package is cheap and never imports torch or TE; ``build`` pulls them in when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from te_assembly.engines import build

_LAZY = {
    "build": "te_assembly.engines",
    "validate_model": "te_assembly.validate",
    "plan_or_raise": "te_assembly.validate",
    "load_model_file": "te_assembly.config",
    "load_model_text": "te_assembly.config",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'te_assembly' has no attribute {name!r}")


__all__ = ["__version__", "build", "load_model_file", "load_model_text", "plan_or_raise", "validate_model"]
