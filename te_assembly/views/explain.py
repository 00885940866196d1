"""What ``explain`` shows and ``model.summary()`` returns: a plan as tables (steps with TE basic-op
indices, fusers, channels, call signature, blocks, parameter counts; under parallel sizes each rank's
slices). Formatting only: no checks happen here. Block steps are collapsed to one row per run of uses
unless ``expand`` names them (``outline.py``)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

from te_assembly.analysis.fusions import FusionTarget
from te_assembly.analysis.parallel.layout import ShardPlan
from te_assembly.analysis.plan import FuserGroup, Plan, PlannedStep, PublicTensor
from te_assembly.catalog import LAYOUTS
from te_assembly.diagnostics import printable
from te_assembly.views.adapters import adapter_table
from te_assembly.views.fusions import fusion_table
from te_assembly.views.outline import Expand, Outline, Uses


def _t(text: str) -> Text:
    """A table cell from a config name: control characters escaped, brackets not read as markup."""
    return Text(printable(text))


def signature(plan: Plan, expand: Expand | None = None) -> str:
    """``model(x, <public inputs>) -> (y, <public outputs>)``; a collapsed block step's tensors once, as
    ``layers[0-23].aux_loss``."""
    view = _View(plan, expand or Expand())
    inputs = ", ".join(["x", *dict.fromkeys(view.tensor_label(t) for t in plan.public_inputs)])
    outputs = ", ".join(["y", *dict.fromkeys(view.tensor_label(t) for t in plan.public_outputs)])
    return printable(f"model({inputs}) -> ({outputs})")


def _layout_note(plan: Plan, layout: str | None) -> str:
    """Where the main path's layout differs from x's: token rows inside a FlattenTokens span."""
    if layout is None or layout == plan.input_layout or (plan.takes_token_ids and layout == "sequence"):
        return ""  # a language model's main path is [batch, seq, features] from its embedding on
    return f" ({'token rows' if layout == 'tokens' else LAYOUTS.get(layout, layout)})"


class _View(Outline):
    """The plan as ``outline`` shows it: names of what a collapsed item holds, use-relative."""

    def __init__(self, plan: Plan, expand: Expand) -> None:
        super().__init__(len(plan.steps), plan.blocks, expand)
        self.plan = plan

    def tensor_label(self, t: PublicTensor) -> str:
        return self.local(t.ref.step, t.name)

    def step_label(self, step: int) -> str:
        return self.local(step, self.plan.steps_by_index[step].name)


def _fusers_of(steps: Sequence[PlannedStep]) -> str:
    fusers = sorted({s.fuser for s in steps if s.fuser is not None})
    if not fusers:
        return "-"
    return str(fusers[0]) if len(fusers) == 1 else f"{fusers[0]}-{fusers[-1]}"


def _step_rows(plan: Plan, view: _View) -> Table:
    steps = Table(title=_t(f"{plan.name}: steps"), title_justify="left")
    for col in ("#", "step", "type", "fuser", "TE basic ops", "width", "params"):
        steps.add_column(col, justify="right" if col in ("#", "params") else "left")
    for item in view.items:
        if isinstance(item, Uses):
            held = [plan.steps[i] for i in item.steps]
            per_use = item.uses[0].num_steps
            modules = sum(1 for s in held if s.kind == "module") // len(item.uses)
            inside = f"{per_use} steps per use" + (f" ({modules} module(s))" if modules else "")
            width = f"{held[0].in_width} -> {held[-1].out_width}"
            params = sum(s.num_params for s in held)
            first, last = item.steps.start, item.steps.stop - 1
            steps.add_row(
                f"{first}-{last}",
                _t(item.label),
                _t(item.what),
                _fusers_of(held),
                inside,
                width,
                f"{params:,}",
            )
            continue
        s = plan.steps[item]
        if s.kind == "module":
            basic, fuser = "(module: ends the fuser)", "-"
        else:
            n = len(s.basic_ops)
            idx = f"{s.first_basic_op}" if n == 1 else f"{s.first_basic_op}-{s.first_basic_op + n - 1}"
            basic, fuser = f"{idx}: {' + '.join(b for b, _ in s.basic_ops)}", str(s.fuser)
        width = f"{s.in_width} -> {s.out_width}" + _layout_note(plan, s.layout)
        owned = f"{s.num_params:,}" + (f" (+ tied to {s.tie_weight})" if s.tie_weight else "")
        steps.add_row(str(s.index), _t(s.name), s.type, fuser, basic, _t(width), _t(owned))
    steps.add_row("", "total", "", "", "", "", f"{plan.num_params:,}")
    return steps


def _fuser_rows(plan: Plan, view: _View) -> Table:
    fusers = Table(title="fusers", title_justify="left")
    for col in ("fuser", "steps", "basic ops", "ended by"):
        fusers.add_column(col)
    run: list[FuserGroup] = []
    head_fusers = {f.index for f in plan.fusers if plan.head is not None and f.steps[0] == plan.head}

    def flush() -> None:
        if not run:
            return
        held = dict.fromkeys(view.item_of(i) for f in run for i in f.steps)
        inside = ", ".join(f"{u.label} ({u.what})" for u in held if u is not None)
        ends = dict.fromkeys(view.step_label(f.ended_by) for f in run if f.ended_by is not None)
        if run[-1].ended_by is None and run[-1].index + 1 in head_fusers:
            ends[_BEFORE_HEAD] = None
        label = str(run[0].index) if len(run) == 1 else f"{run[0].index}-{run[-1].index}"
        basic = sum(f.num_basic_ops for f in run)
        fusers.add_row(label, _t(f"inside {inside}"), f"{basic} in all", _t(", ".join(ends) or "-"))
        run.clear()

    for f in plan.fusers:
        if all(view.item_of(i) is not None for i in f.steps):
            run.append(f)
            continue
        flush()
        names = list(dict.fromkeys(_held_name(view, i) for i in f.steps))
        end = view.step_label(f.ended_by) if f.ended_by is not None else "-"
        if f.ended_by is None and f.index + 1 in head_fusers:
            end = _BEFORE_HEAD
        fusers.add_row(str(f.index), _t(", ".join(names)), str(f.num_basic_ops), _t(end))
    flush()
    return fusers


_BEFORE_HEAD = "the head (run in chunks for a loss)"
"""Why a fuser ends where no module step does: a language model's head begins (``analysis/head.py``)."""


def _held_name(view: _View, step: int) -> str:
    item = view.item_of(step)
    return f"{item.label} (collapsed)" if item is not None else view.plan.steps_by_index[step].name


def _channel_rows(plan: Plan, view: _View) -> Table:
    channels = Table(title="channels", title_justify="left")
    for col in ("channel", "dtype", "producer", "consumers", "visibility", "route"):
        channels.add_column(col)
    routes = {r.channel: r for r in plan.reroutes}
    rows: dict[str, tuple[str, ...]] = {}
    for c in plan.channels.values():
        p = c.producer.step
        label = view.local(p, c.name)
        if label in rows:
            continue  # the same channel of another use in this collapsed item
        producer = view.local(p, f"{plan.steps_by_index[p].name}.{c.producer.slot_name}")
        cons = ", ".join(
            view.local(r.step, f"{plan.steps_by_index[r.step].name}.{r.slot_name}") for r in c.consumers
        )
        route = "in its fuser"
        if c.name in routes:
            route = "rerouted " + view.describe(routes[c.name], plan.steps)
        visibility = "public" if c.public else "internal"
        rows[label] = (label, c.dtype, producer, cons or "(none)", visibility, route)
    for label, dtype, producer, cons, visibility, route in rows.values():
        channels.add_row(_t(label), dtype, _t(producer), _t(cons), visibility, _t(route))
    return channels


def _signature_rows(plan: Plan, view: _View, expand: Expand) -> Table:
    sig = Table(title=Text(f"call signature: {signature(plan, expand)}"), title_justify="left")
    for col in ("direction", "name", "slot", "dtype"):
        sig.add_column(col)
    shape = LAYOUTS[plan.input_layout].replace("features", str(plan.in_features))
    x_dtype = "int64" if plan.takes_token_ids else "float"
    sig.add_row("input", "x", _t(f"{shape} ({plan.input_layout_source})"), x_dtype)
    seen: set[tuple[str, str]] = set()
    for direction, tensors in (("input", plan.public_inputs), ("output", plan.public_outputs)):
        for t in tensors:
            label = view.tensor_label(t)
            if (direction, label) in seen:
                continue
            seen.add((direction, label))
            item = view.item_of(t.ref.step)
            where = view.step_label(t.ref.step)
            fuser = f"fuser {t.fuser}" if item is None else "in each use"
            sig.add_row(direction, _t(label), _t(f"{where}.{t.ref.slot_name} ({fuser})"), t.dtype)
    return sig


def _block_rows(plan: Plan) -> Table:
    table = Table(title="blocks", title_justify="left")
    for col in ("step", "block", "defined in", "uses", "steps per use", "params per use", "dims"):
        table.add_column(
            col, justify="right" if col in ("uses", "steps per use", "params per use") else "left"
        )
    for group in plan.blocks:
        first = group.uses[0]
        params = sum(plan.steps[i].num_params for i in first.steps)
        dims = ", ".join(f"{k}={v}" for k, v in first.dims.items())
        differ = [
            f"use {u.index}: " + ", ".join(f"{k}={v}" for k, v in u.dims.items() if first.dims.get(k) != v)
            for u in group.uses[1:]
            if u.dims != first.dims
        ]
        if differ:
            dims += "; " + "; ".join(differ)
        table.add_row(
            _t(group.name),
            _t(group.block),
            _t(group.file or "-"),
            str(len(group.uses)),
            str(first.num_steps),
            f"{params:,}",
            _t(dims or "-"),
        )
    return table


def plan_tables(plan: Plan, expand: Expand | None = None) -> list[Table]:
    """Steps, fusers, channels and the call signature; a block step's uses collapsed to one row per run
    unless ``expand`` names them (``outline.py``), with a table of the blocks used."""
    expand = expand or Expand()
    view = _View(plan, expand)
    tables = [_step_rows(plan, view)]
    if plan.blocks:
        tables.append(_block_rows(plan))
    tables.extend([_fuser_rows(plan, view), _channel_rows(plan, view), _signature_rows(plan, view, expand)])
    return tables


def tables(
    plan: Plan,
    layout: ShardPlan | None = None,
    expand: Expand | None = None,
    fusions: FusionTarget | None = None,
) -> list[Table]:
    """What ``explain`` prints, and ``model.summary()`` returns as text: the plan's tables (block steps
    collapsed unless ``expand`` names them), when the ``parallel`` sizes split the model each rank's
    local shapes and parameter counts, and the TE fusions for ``fusions`` (default: a CPU, float32, no
    recipe)."""
    out = plan_tables(plan, expand)
    target = fusions or FusionTarget.of(None, recipe=None, dtype="float32")
    if layout is not None and layout.settings.is_parallel:
        from te_assembly.views.parallel_report import layout_tables

        out.extend(layout_tables(plan, layout, str(getattr(target, "dtype", "float32"))))
    out.append(fusion_table(plan, target, expand))
    adapters = adapter_table(plan, target)
    if adapters is not None:
        out.append(adapters)
    return out
