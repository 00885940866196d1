"""What the commands that build a model share: the checked plan, the ``Target`` its settings describe
(said in one line), and a progress bar fed by a job's events.

Kept apart from ``common`` because it imports torch, which ``validate`` must never do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from te_assembly.analysis.analyze import COMMON, PARALLEL, Analysis
from te_assembly.analysis.plan import Plan
from te_assembly.analysis.settings import CommonSettings
from te_assembly.cli.commands.common import checked_plan
from te_assembly.engines.target import Target
from te_assembly.jobs.events import Advanced


@dataclass(frozen=True)
class Session:
    """A validated plan plus the target its settings describe."""

    analysis: Analysis
    plan: Plan
    target: Target

    def section(self, name: str) -> Any:
        return self.analysis.section(name)

    def distributed(
        self, command: str, tokens: tuple[str, int], seq_len: int | None = None
    ) -> AbstractContextManager[Target]:
        """The target on this process's part of the ``parallel`` layout, for the duration of ``command``
        (``Target.distributed``)."""
        return self.target.distributed(
            self.plan,
            self.section(PARALLEL),
            command=command,
            tokens=tokens,
            seq_len=seq_len,
            layout=self.analysis.layout,
            config_sha256=config_sha256(self.analysis),
        )


def config_sha256(analysis: Analysis) -> str:
    """SHA-256 of the resolved config as the commands read it (the model, the recipe, every setting):
    the ranks of a job compare theirs at start."""
    import hashlib
    import json

    text = json.dumps(analysis.resolved.as_config(), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def start(analysis: Analysis, console: Console) -> Session:
    """The plan (exit 2 with every diagnostic otherwise), the engine and device, said in one line."""
    plan = checked_plan(analysis, console)
    common: CommonSettings = analysis.section(COMMON)
    target = Target.from_settings(common, analysis.recipe)
    console.print(target.reason, markup=False)
    return Session(analysis, plan, target)


class ProgressBar:
    """One rich progress bar per task a job reports (``jobs.events.Advanced``), shown from its first
    event on."""

    def __init__(self, console: Console, transient: bool = False) -> None:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        self.progress = Progress(*columns, console=console, transient=transient)
        self.tasks: dict[str, TaskID] = {}
        self.started = False

    def on_event(self, event: object) -> None:
        if not isinstance(event, Advanced):
            return
        if not self.started:
            self.progress.start()
            self.started = True
        task = self.tasks.get(event.task)
        if task is None:
            task = self.tasks[event.task] = self.progress.add_task(event.task, total=event.total)
        self.progress.update(task, completed=event.done, description=event.description or event.task)

    def close(self) -> None:
        if self.started:
            self.progress.stop()
            self.started = False


@contextlib.contextmanager
def progress_bar(console: Console, transient: bool = False) -> Iterator[ProgressBar]:
    bar = ProgressBar(console, transient)
    try:
        yield bar
    finally:
        bar.close()
