"""Printing under torchrun: only rank 0 prints tables and progress; every rank prints its errors,
tagged with its rank (``[rank 1/2] error: ...``)."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from te_assembly.analysis.parallel.launch import Launch, current_launch


class RankConsole(Console):
    """A console whose every printed string starts with this rank's tag, so the lines of several ranks
    interleaved in one terminal (or torchrun's log) stay attributable."""

    def __init__(self, tag: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._tag = tag

    def print(self, *objects: Any, **kwargs: Any) -> None:  # type: ignore[override]
        if objects and isinstance(objects[0], str):
            objects = (self._tag + objects[0], *objects[1:])
        super().print(*objects, **kwargs)


def rank_consoles(console: Console, err: Console, launch: Launch | None = None) -> tuple[Console, Console]:
    """(stdout, stderr) consoles for this rank: under torchrun only rank 0 prints tables and progress;
    every rank prints its errors, tagged with its rank."""
    launch = current_launch() if launch is None else launch
    if not launch.under_torchrun:
        return console, err
    out = console if launch.is_main else Console(file=io.StringIO(), quiet=True)
    tagged = RankConsole(launch.tag, stderr=True, highlight=False, width=err.width)
    return out, tagged


__all__ = ["RankConsole", "rank_consoles"]
