"""What the commands that build a model share: config sections, device, dtype, engine choice.

Kept apart from ``common`` because it imports torch, which ``validate`` must never do.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from rich.console import Console

from te_assembly.analysis.analyze import COMMON, PARALLEL, Analysis
from te_assembly.analysis.plan import Plan
from te_assembly.analysis.recipes import Recipe
from te_assembly.analysis.settings import CommonSettings
from te_assembly.cli.commands.common import checked_plan
from te_assembly.engines import check_device, resolve_engine

if TYPE_CHECKING:
    from te_assembly.engines.parallel.context import ParallelContext

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
}
"""The torch dtype of each ``dtype`` setting (``settings.DTYPES`` names them)."""

NO_RECIPE = Recipe({"kind": "none", "name": "none"})
"""What ``recipe=null`` stands for: no quantization."""


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when a GPU is visible, else CPU (``name`` is checked by the settings spec; the
    rest as ``build()`` checks its ``device``)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return check_device(name)


@dataclass(frozen=True)
class Session:
    """A validated plan plus the resolved run settings every model-building command needs."""

    analysis: Analysis
    plan: Plan
    engine: str
    kernels: str
    device: torch.device
    dtype: torch.dtype
    seed: int

    def section(self, name: str) -> Any:
        return self.analysis.section(name)

    @property
    def recipe(self) -> Recipe:
        return self.analysis.recipe or NO_RECIPE

    @property
    def engine_recipe(self) -> Recipe | None:
        """The recipe to hand to ``build``: the TE engine runs its forwards under its ``te.autocast``;
        the reference engine has none."""
        return self.recipe if self.engine == "te" else None

    def parallel(
        self, command: str, tokens: tuple[str, int], seq_len: int | None = None
    ) -> AbstractContextManager[ParallelContext]:
        """This process's part of the ``parallel`` layout, for the duration of ``command`` (process
        groups started and torn down; launch and ``tokens``, (key, rows per batch), checked first: whole
        sequences of ``seq_len`` rows each when the model takes ``[batch, seq, features]``)."""
        from te_assembly.engines.parallel.runtime import parallel_run

        settings = self.section(PARALLEL)
        layout = self.analysis.layout
        sequences = seq_len if self.plan.input_layout == "sequence" else None
        return parallel_run(
            self.plan, settings, self.device, command=command, tokens=tokens, layout=layout, seq_len=sequences
        )


def start(analysis: Analysis, console: Console) -> Session:
    """The plan (exit 2 with every diagnostic otherwise), the engine and device, said in one line."""
    plan = checked_plan(analysis, console)
    common: CommonSettings = analysis.section(COMMON)
    engine, reason = resolve_engine(common.engine, common.kernels)
    device = resolve_device(common.device)
    session = Session(analysis, plan, engine, common.kernels, device, DTYPES[common.dtype], common.seed)
    console.print(reason, markup=False)
    return session
