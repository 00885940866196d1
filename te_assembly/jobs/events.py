"""What a job tells its caller while it works, without printing: a job takes ``on_event`` and calls it
with these; the CLI turns them into lines and progress bars, a script may ignore them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar


@dataclass(frozen=True)
class Built:
    """The model is built: the engine runs here (``run`` prints the plan only then)."""

    model: Any


@dataclass(frozen=True)
class Advanced:
    """``done`` of ``total`` units of ``task`` are finished (``description``: what to show beside it)."""

    task: str
    done: int
    total: int
    description: str = ""


@dataclass(frozen=True)
class Note:
    """A line for the user (a setting the job had to interpret, what a model without parameters
    means for the timings...)."""

    text: str


OnEvent = Callable[[object], None]
E = TypeVar("E")


def ignore(event: object) -> None:
    """The default ``on_event``: nothing is shown."""


def only(kind: type[E], handle: Callable[[E], object]) -> OnEvent:
    """An ``on_event`` that hands ``handle`` the events of one ``kind`` and ignores the rest
    (``on_event=only(StepRecord, records.append)``)."""

    def on_event(event: object) -> None:
        if isinstance(event, kind):
            handle(event)

    return on_event


__all__ = ["Advanced", "Built", "Note", "OnEvent", "ignore", "only"]
