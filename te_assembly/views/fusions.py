"""``explain``'s fusion table: per fuser, the TE fused ops that will fire and each near miss, with the
change that would make it fire (``analysis/fusions.py``). A block step's uses collapsed as elsewhere:
one row for what every use shares."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from te_assembly.analysis.fusions import FuserFusions, FusionTarget, predict, without_te_kernel
from te_assembly.analysis.plan import Plan
from te_assembly.diagnostics import printable
from te_assembly.views.outline import Expand, Outline, use_of


def fusion_table(plan: Plan, target: FusionTarget, expand: Expand | None = None) -> Table:
    view = Outline(len(plan.steps), plan.blocks, expand or Expand())
    recipe = target.recipe_kind or "no quantization recipe"
    title = f"TE fusions (for {target.name}, {target.dtype}, {recipe}, kernels={target.kernels})"
    table = Table(title=Text(title), title_justify="left")
    for column in ("fuser", "pass", "fused op"):
        table.add_column(column)
    # Bounded, so the table is as wide in a 120-column terminal as in model.summary(width=400).
    table.add_column("steps", max_width=36)
    table.add_column("status", max_width=60)
    if target.kernels != "te":
        table.add_row(
            "-", "-", "-", "-", "none fire: kernels=reference runs our reference ops in TE's fusers"
        )
        return table
    rows: dict[tuple[str, ...], list[int]] = {}
    for fuser in predict(plan, target):
        for row in _rows(plan, view, fuser):
            rows.setdefault(row, []).append(fuser.fuser)
    for (direction, name, steps, status), fusers in rows.items():
        shown = str(fusers[0]) if len(fusers) == 1 else f"{fusers[0]}-{fusers[-1]} ({len(fusers)})"
        table.add_row(shown, direction, name, Text(printable(steps)), Text(printable(status)))
    if not rows:
        table.add_row("-", "-", "-", "-", "no pattern of TE's fused ops matches these fusers")
    for (type_, missing), names in without_te_kernel(plan).items():
        local = sorted({view.local(plan.step(name).index, name) for name in names})
        status = f"TE has no kernel for {missing}: the reference {type_} runs in the TE engine"
        table.add_row("-", "-", type_, Text(printable(", ".join(local))), Text(printable(status)))
    return table


def _collapsed(plan: Plan, view: Outline, steps: tuple[str, ...], text: str) -> str:
    """``text`` with the names of a collapsed block use's steps and channels use-relative
    (``layers.3.add_mlp`` -> ``layers[0-23].add_mlp``), so every use shares one row."""
    for name in steps:
        index = plan.step(name).index
        item, found = view.item_of(index), use_of(plan.blocks, index)
        if item is not None and found is not None:
            group, use = found
            text = text.replace(group.prefix(use.index), f"{item.label}.")
    return text


def _rows(plan: Plan, view: Outline, fuser: FuserFusions) -> list[tuple[str, str, str, str]]:
    def names(steps: tuple[str, ...]) -> str:
        return ", ".join(view.local(plan.step(s).index, s) for s in steps)

    out = []
    for direction, fired in (("forward", fuser.forward), ("backward", fuser.backward)):
        for f in fired:
            out.append(
                (
                    f.fusion.passes if f.fusion.passes == "joint" else direction,
                    f.fusion.name,
                    names(f.steps),
                    "fires",
                )
            )
    for near in fuser.near_misses:
        parts = []
        for m in near.misses:
            text = m.condition + (f" -> {m.change}" if m.change else "")
            if m.safe is not None:
                text += f" ({'safe' if m.safe else 'unsafe'}: {m.why})"
            parts.append(text)
        status = _collapsed(plan, view, near.steps, "near miss: " + "; ".join(parts))
        out.append((near.fusion.passes, near.fusion.name, names(near.steps), status))
    return out


__all__ = ["fusion_table"]
