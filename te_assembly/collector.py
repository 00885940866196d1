"""The cyclic garbage collector, paused while a config goes through the pipeline.

Parsing and validating a 10,000-step model makes about a million small, acyclic objects. Each of the
collector's full passes rescans all of them and frees nothing, and together they cost as much as the
work itself (measured: 0.95 s with the collector on, 0.60 s with it paused, for ``load`` of a
10,000-step model). Reference counting still frees everything as usual.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Pause the collector for the block (nesting is fine); restore its state after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


__all__ = ["paused"]
