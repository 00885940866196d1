"""A built model shown: ``model.summary()`` (the ``explain`` tables as text) and ``model.plot(path)``
(the ``graph`` picture), from the same code as the commands. The engines reach these through
``te_assembly.display`` (they sit below the views); ``te_assembly/__init__.py`` wires it."""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from te_assembly.errors import ArgumentError
from te_assembly.views.outline import Expand, parse_expand


class Summary(str):
    """``model.summary()``'s text: a ``str`` that a Python prompt shows as the tables themselves."""

    def __repr__(self) -> str:
        return str(self)


def summary(model: Any, width: int | None = None, expand: Sequence[str] = ()) -> Summary:
    """``model.summary()`` (``engines/base.py`` says what it shows)."""
    import torch
    from rich.console import Console

    from te_assembly.analysis.fusions import FusionTarget
    from te_assembly.views.explain import tables

    columns = width or shutil.get_terminal_size((120, 24)).columns
    buffer = io.StringIO()
    console = Console(file=buffer, width=columns, color_system=None, highlight=False, force_terminal=False)
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    target = FusionTarget.of(
        None,
        recipe=getattr(model, "recipe", None),
        dtype=str(dtype).removeprefix("torch."),
        kernels=getattr(model, "kernels", "te"),
    )
    for table in tables(model.plan, expand=_expand(model, expand), fusions=target):
        console.print(table)
    return Summary(buffer.getvalue())


def plot(model: Any, path: str | os.PathLike[str], expand: Sequence[str] = ()) -> Path:
    """``model.plot(path)`` (``engines/base.py`` says what it draws)."""
    from te_assembly.views.graph import render_file, view_from_plan

    return render_file(view_from_plan(model.plan, _expand(model, expand)), path)


def _expand(model: Any, names: Sequence[str]) -> Expand:
    if isinstance(names, str):  # one name, not its characters
        names = [names]
    expand, problems = parse_expand(list(names), model.plan.blocks, "expand")
    if problems:
        raise ArgumentError("; ".join(d.format() for d in problems))
    return expand


__all__ = ["Summary", "plot", "summary"]
