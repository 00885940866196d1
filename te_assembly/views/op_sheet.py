"""An op or module as the catalog declares it, as lines and tables of plain text: what ``ls op NAME``
prints and what ``docs/reference/ops.md`` is generated from (``scripts/gen_reference.py``), one
reading of the catalog for both. Pure Python: no torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from te_assembly.catalog import ModuleSpec, OpSpec
from te_assembly.fields import REQUIRED, show


@dataclass(frozen=True)
class SheetTable:
    title: str
    columns: tuple[str, ...]
    rows: list[tuple[str, ...]] = field(default_factory=list)


def default_text(value: object) -> str:
    return "required" if value is REQUIRED else show(value)


def op_sheet(spec: OpSpec | ModuleSpec) -> list[str | SheetTable]:
    """One op or module: what it is, its classes, its arguments, its slots in TE's order, its width rule
    and what else the catalog says of it."""
    out: list[str | SheetTable] = []
    if isinstance(spec, OpSpec):
        te = (
            spec.te_class.replace(":", ".")
            if spec.te_class
            else "none: our own op (the TE engine adapts the reference)"
        )
        out += [
            f"{spec.name} (op): {spec.doc}",
            f"TE class: {te}",
            f"reference class: {spec.reference.replace(':', '.')}",
        ]
    else:
        out += [
            f"{spec.name} (module, ends the fuser it follows): {spec.doc}",
            f"torch class: {spec.torch_class.replace(':', '.')}",
        ]
    out.append(_arguments(spec) if spec.params else "arguments: none")
    if isinstance(spec, OpSpec):
        out += _slots(spec)
    out.append(f"width: {spec.width.describe()}")
    out.append(f"costs: {spec.cost.describe()}")
    if spec.token_wise:
        out.append("per token: each row from its own row alone; a language model's head may hold it")
    if isinstance(spec, OpSpec):
        out += _notes(spec)
    return out


def _arguments(spec: OpSpec | ModuleSpec) -> SheetTable:
    table = SheetTable("arguments (args:)", ("name", "type", "default", "allowed", "what it does"))
    for p in spec.params:
        if p.choices:
            allowed = ", ".join(show(c) for c in p.choices)
        else:
            allowed = p.spec.range_text() if p.spec.type in (int, float) else ""
        table.rows.append((p.name, p.type_name, default_text(p.default), allowed, p.doc))
    return table


def _slots(spec: OpSpec) -> list[str | SheetTable]:
    out: list[str | SheetTable] = []
    for title, slots in (
        ("extra inputs (extra_inputs:)", spec.inputs),
        ("extra outputs (extra_outputs:)", spec.outputs),
    ):
        if not slots:
            out.append(f"{title.split(' (')[0]}: none")
            continue
        table = SheetTable(f"{title}, in TE's slot order", ("#", "slot", "carries", "what it is"))
        table.rows.extend((str(i), slot.name, slot.describe(), slot.doc) for i, slot in enumerate(slots))
        out.append(table)
    return out


def _notes(spec: OpSpec) -> list[str | SheetTable]:
    out: list[str | SheetTable] = []
    if spec.expands_to is not None:
        out.append("TE builds it as several basic ops (explain shows them and their indices per step)")
    if spec.rows_delta:
        change = (
            "fans each token row out to expert rows"
            if spec.rows_delta > 0
            else "folds expert rows back to tokens"
        )
        out.append(f"rows: {change} (a model with it takes x as [tokens, features])")
    if spec.in_place_arg:
        out.append(
            "in_place: aliases the channel tensor instead of copying it (a hazard at channel endpoints)"
        )
    if spec.te_class is None:  # no TE kernel to ask about: the reference op runs everywhere
        out.append("TE's own kernel: none (the reference op runs inside TE's fuser, on CPU and GPU)")
    else:
        cpu = "yes" if spec.te_runs_on_cpu else "no (a GPU, or kernels=reference)"
        out.append(f"TE's own kernel runs on CPU: {cpu}")
    return out


__all__ = ["SheetTable", "default_text", "op_sheet"]
