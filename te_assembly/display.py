"""What the engines and jobs need the views for, without importing them: a built model shows itself
(``model.summary()``, ``model.plot()``) and a training run draws its loss curve (``train.plot``), but the
views sit above the engines and the jobs. The package's top, ``te_assembly/__init__.py``, hands this module
the function that finds them (``views/provided.py``), as an application wires its parts at its root.
Torch-free, and nothing is imported until something is shown."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_views: Callable[[], Any] | None = None


def provide(views: Callable[[], Any]) -> None:
    """Where ``views()`` finds the module that shows things (called once, by the package's top)."""
    global _views
    _views = views


def views() -> Any:
    """The module with ``summary(model, width, expand)``, ``plot(model, path, expand)`` and
    ``draw_run(result)``."""
    if _views is None:  # pragma: no cover - te_assembly/__init__.py provides it on import
        raise RuntimeError("te_assembly.display: no views provided (te_assembly/__init__.py does it)")
    return _views()


__all__ = ["provide", "views"]
