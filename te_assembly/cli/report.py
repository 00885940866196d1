"""Printing diagnostics and plans for people. Formatting only: no checks happen here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from te_assembly.catalog import LAYOUTS
from te_assembly.cli.commands import Outcome
from te_assembly.diagnostics import Diagnostic, printable
from te_assembly.plan import Plan


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


def signature(plan: Plan) -> str:
    inputs = ", ".join(["x", *(t.name for t in plan.public_inputs)])
    outputs = ", ".join(["y", *(t.name for t in plan.public_outputs)])
    return printable(f"model({inputs}) -> ({outputs})")


def _layout_note(plan: Plan, layout: str | None) -> str:
    """Where the main path's layout differs from x's: token rows inside a FlattenTokens span."""
    if layout is None or layout == plan.input_layout:
        return ""
    return f" ({'token rows' if layout == 'tokens' else LAYOUTS.get(layout, layout)})"


def plan_tables(plan: Plan) -> list[Table]:
    steps = Table(title=_t(f"{plan.name}: steps"), title_justify="left")
    for col in ("#", "step", "type", "fuser", "TE basic ops", "width", "params"):
        steps.add_column(col, justify="right" if col in ("#", "params") else "left")
    for s in plan.steps:
        if s.kind == "module":
            basic, fuser = "(module: ends the fuser)", "-"
        else:
            n = len(s.basic_ops)
            idx = f"{s.first_basic_op}" if n == 1 else f"{s.first_basic_op}-{s.first_basic_op + n - 1}"
            basic, fuser = f"{idx}: {' + '.join(b for b, _ in s.basic_ops)}", str(s.fuser)
        width = f"{s.in_width} -> {s.out_width}" + _layout_note(plan, s.layout)
        steps.add_row(str(s.index), _t(s.name), s.type, fuser, basic, width, f"{s.num_params:,}")
    steps.add_row("", "total", "", "", "", "", f"{plan.num_params:,}")

    channels = Table(title="channels", title_justify="left")
    for col in ("channel", "dtype", "producer", "consumers", "visibility"):
        channels.add_column(col)
    for c in plan.channels.values():
        prod = plan.steps_by_index[c.producer.step]
        cons = ", ".join(f"{plan.steps_by_index[r.step].name}.{r.slot_name}" for r in c.consumers) or "(none)"
        channels.add_row(
            _t(c.name),
            c.dtype,
            _t(f"{prod.name}.{c.producer.slot_name}"),
            _t(cons),
            "public" if c.public else "internal",
        )

    fusers = Table(title="fusers", title_justify="left")
    for col in ("fuser", "steps", "basic ops", "ended by"):
        fusers.add_column(col)
    for f in plan.fusers:
        names = ", ".join(plan.steps_by_index[i].name for i in f.steps)
        end = plan.steps_by_index[f.ended_by].name if f.ended_by is not None else "-"
        fusers.add_row(str(f.index), _t(names), str(f.num_basic_ops), _t(end))

    sig = Table(title=Text(f"call signature: {signature(plan)}"), title_justify="left")
    for col in ("direction", "name", "slot", "dtype"):
        sig.add_column(col)
    shape = LAYOUTS[plan.input_layout].replace("features", str(plan.in_features))
    sig.add_row("input", "x", _t(f"{shape} ({plan.input_layout_source})"), "float")
    for t in plan.public_inputs:
        step = plan.steps_by_index[t.ref.step]
        sig.add_row("input", _t(t.name), _t(f"{step.name}.{t.ref.slot_name} (fuser {t.fuser})"), t.dtype)
    for t in plan.public_outputs:
        step = plan.steps_by_index[t.ref.step]
        sig.add_row("output", _t(t.name), _t(f"{step.name}.{t.ref.slot_name} (fuser {t.fuser})"), t.dtype)
    return [steps, fusers, channels, sig]


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
