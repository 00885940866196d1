"""Printing diagnostics and sweep summaries for people. Formatting only: no checks happen here. (A
plan's tables are ``views/explain.py``.)"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from te_assembly.cli.commands import Outcome
from te_assembly.diagnostics import Diagnostic, printable


def _t(text: str) -> Text:
    """A table cell from a config name: control characters escaped, brackets not read as markup."""
    return Text(printable(text))


def print_diagnostics(diags: Sequence[Diagnostic], console: Console) -> None:
    errors = [d for d in diags if d.is_error]
    for d in diags:
        style = "bold red" if d.is_error else "yellow"
        console.print(d.format(), style=style, markup=False, soft_wrap=True)
    warnings = len(diags) - len(errors)
    if errors:
        console.print(f"{len(errors)} error(s), {warnings} warning(s)", style="bold red", markup=False)


def sweep_table(command: str, outcomes: list[tuple[list[str], Outcome]]) -> Table:
    """One row per job of a sweep (``-m``): its overrides, exit code and the numbers its command
    reported; number columns also as a ratio to the first job."""
    shared = [o for o in outcomes[0][0] if all(o in overrides for overrides, _ in outcomes)]
    title = f"{command} sweep: {len(outcomes)} job(s)" + (f", all with {' '.join(shared)}" if shared else "")
    table = Table(title=_t(title), title_justify="left")
    table.add_column("job", justify="right")
    table.add_column("overrides")
    table.add_column("exit", justify="right")
    columns: list[str] = []
    for _, outcome in outcomes:
        columns.extend(k for k in outcome.summary if k not in columns)
    for column in columns:
        table.add_column(column, justify="right")
    first = outcomes[0][1].summary
    for number, (overrides, outcome) in enumerate(outcomes):
        cells = [_cell(outcome.summary.get(c), first.get(c), number > 0) for c in columns]
        own = [o for o in overrides if o not in shared]
        table.add_row(str(number), _t(" ".join(own) or "(none)"), str(outcome.code), *cells)
    return table


def _cell(value: Any, base: Any, ratio: bool) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        text = f"{value:,.3f}" if value < 1000 else f"{value:,.0f}"
        if ratio and isinstance(base, float) and base:
            text += f" ({value / base:.2f}x)"
        return text
    return printable(str(value))


@contextlib.contextmanager
def tensor_progress(console: Console, verb: str) -> Iterator[Callable[[int, int, str], None]]:
    """A progress bar for work done tensor by tensor (import and export): ``progress(done, total,
    name)``. Drawn only on a terminal; elsewhere the command's own lines say what happened."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(
        TextColumn(f"{verb} tensors"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.description}"),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
    task = bar.add_task("", total=None)

    def update(done: int, total: int, name: str) -> None:
        bar.update(task, completed=done, total=total, description=printable(name))

    with bar:
        yield update
