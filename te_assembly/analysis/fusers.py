"""Pass 3b, fusers: the runs of consecutive ``op`` steps between ``module`` steps (as in
``te.ops.Sequential``), and one more cut where a language model's head begins (``head.py``), so the
head runs as fusers of its own.

Returns the steps with ``fuser`` and ``first_basic_op`` set (new objects) and the fuser groups.
"""

from __future__ import annotations

from collections.abc import Sequence

from te_assembly.analysis.plan import FuserGroup, PlannedStep


def assign_fusers(
    steps: Sequence[PlannedStep | None], cut_before: int | None = None
) -> tuple[list[PlannedStep | None], list[FuserGroup]]:
    """Group op steps into fusers; a module step ends a run, and so does position ``cut_before``. Steps
    too broken to plan (None) are skipped, so one bad step does not split its neighbours' channels."""
    result: list[PlannedStep | None] = list(steps)
    fusers: list[FuserGroup] = []
    run: list[int] = []

    def close(ended_by: int | None) -> None:
        if run:
            basic = 0
            for position in run:
                step = result[position]
                assert step is not None
                result[position] = step.evolve(fuser=len(fusers), first_basic_op=basic)
                basic += len(step.basic_ops) if step.args_valid else 1
            indices = tuple(s.index for s in (result[p] for p in run) if s is not None)
            fusers.append(FuserGroup(len(fusers), indices, basic, ended_by))
            run.clear()

    for position, step in enumerate(steps):
        if position == cut_before:
            close(None)
        if step is not None and step.kind == "op":
            run.append(position)
        elif step is not None and step.kind == "module":
            close(step.index)
    close(None)
    return result, fusers
