"""The channel graph as data: nodes (x, steps, collapsed block uses, public tensors, missing channels)
and edges (the main path, channels, rerouted channels, errors) in drawing order, with the fusers as
clusters. ``graph.py`` draws it as Mermaid, DOT, SVG or PNG.

Pure Python (no torch). The view is built from the validator's steps, so a config with errors still
draws: whatever could be planned is shown and each problem is marked in red (a dangling input as a red
node named after the missing channel, a rejected slot as a red edge).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from te_assembly.analysis.analyze import Analysis
from te_assembly.analysis.plan import BlockGroup, FuserGroup, Plan, PlannedStep, Reroute, SlotRef
from te_assembly.diagnostics import Diagnostic
from te_assembly.views.outline import Expand, Outline, Uses, local_name

NodeKind = Literal["x", "y", "op", "module", "block", "invalid", "public_input", "public_output", "missing"]
EdgeKind = Literal["spine", "internal", "public", "rerouted", "error"]


_STEP_PATH = re.compile(r"^model\.ops\[(\d+)\]")


@dataclass(frozen=True)
class Node:
    id: str
    label: str
    kind: NodeKind
    fuser: int | None = None
    error: str | None = None
    """Why the node is drawn red (first error diagnostic about it), or None."""


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    kind: EdgeKind
    label: str = ""
    src_slot: str | None = None
    dst_slot: str | None = None
    error: str | None = None


@dataclass
class GraphView:
    """Everything both renderers draw: nodes, edges and fuser clusters, in drawing order."""

    name: str
    nodes: list[Node] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    clusters: dict[int, list[str]] = field(default_factory=dict)
    """Fuser index -> ids of the step nodes inside it."""
    cluster_labels: dict[int, str] = field(default_factory=dict)
    diagnostics: list[Diagnostic] = field(default_factory=list)

    def node(self, node_id: str) -> Node:
        return next(n for n in self.nodes if n.id == node_id)

    def nodes_of(self, kind: NodeKind) -> list[Node]:
        return [n for n in self.nodes if n.kind == kind]

    @property
    def has_errors(self) -> bool:
        return any(d.is_error for d in self.diagnostics)


def step_id(index: int) -> str:
    return f"s{index}"


def view_from_plan(plan: Plan, expand: Expand | None = None) -> GraphView:
    """Draw a plan; its block steps collapsed unless ``expand`` names them (``outline.py``)."""
    return build_view(
        plan.name,
        list(plan.steps),
        plan.fusers,
        plan.warnings,
        plan.producer_of,
        blocks=plan.blocks,
        reroutes=plan.reroutes,
        expand=expand,
    )


def view_from_analysis(analysis: Analysis, expand: Expand | None = None) -> GraphView:
    """Draw a config, valid or not, with every diagnostic of its analysis (marked on the steps they
    concern, also inside a block's uses)."""
    marks = analysis.step_diagnostics
    if analysis.plan is not None:
        plan = analysis.plan
        return build_view(
            plan.name,
            list(plan.steps),
            plan.fusers,
            analysis.diagnostics,
            plan.producer_of,
            step_diagnostics=marks,
            blocks=plan.blocks,
            reroutes=plan.reroutes,
            expand=expand,
        )
    model = analysis.resolved.model or {}
    name = model.get("name") if isinstance(model, Mapping) else None
    graph = analysis.graph
    producer_of = graph.producer_of if graph is not None else (lambda step, slot: None)
    title = name if isinstance(name, str) and name else "model"
    return build_view(
        title,
        list(analysis.steps),
        analysis.fusers,
        analysis.diagnostics,
        producer_of,
        step_diagnostics=marks,
        blocks=analysis.blocks,
        reroutes=graph.reroutes if graph is not None else (),
        expand=expand,
    )


def _step_errors(diagnostics: Sequence[Diagnostic]) -> dict[int, str]:
    out: dict[int, str] = {}
    for d in diagnostics:
        m = _STEP_PATH.match(d.path)
        if d.is_error and m:
            out.setdefault(int(m.group(1)), d.message)
    return out


def build_view(
    name: str,
    steps: Sequence[PlannedStep | None],
    fusers: Sequence[FuserGroup],
    diagnostics: Sequence[Diagnostic] = (),
    producer_of: Callable[[int, int], SlotRef | None] = lambda step, slot: None,
    *,
    step_diagnostics: Sequence[Diagnostic] | None = None,
    blocks: Sequence[BlockGroup] = (),
    reroutes: Sequence[Reroute] = (),
    expand: Expand | None = None,
) -> GraphView:
    """Nodes and edges of the steps; ``producer_of(step, slot)`` is the channel graph's answer to which
    output feeds an input slot (``ChannelGraph.producer_of``, ``Plan.producer_of``). ``diagnostics``
    are the ones printed; ``step_diagnostics`` (default: the same) are the ones marked on steps, at the
    expanded model's key paths. A block step's uses are one node per run of uses unless ``expand`` names
    them; a channel read in a later fuser is drawn as a rerouted edge."""
    view = GraphView(name, diagnostics=list(diagnostics))
    marks = list(diagnostics if step_diagnostics is None else step_diagnostics)
    errors = _step_errors(marks)
    shown = Outline(len(steps), blocks, expand)
    hidden = shown.collapsed
    view.nodes.append(Node("x", "x", "x"))
    for f in fusers:
        if any(i not in hidden for i in f.steps):
            view.clusters[f.index] = []
            view.cluster_labels[f.index] = f"fuser {f.index} ({f.num_basic_ops} basic ops)"
    fuser_after_module = {f.ended_by: f.index for f in fusers if f.ended_by is not None}
    spine: list[str] = ["x"]
    for item in shown.items:
        if isinstance(item, Uses):
            nid = _block_id(item)
            error = next((errors[i] for i in item.steps if i in errors), None)
            label = f"{item.label}\n{item.what}" + _reroute_note(item, steps, reroutes)
            view.nodes.append(Node(nid, label, "block", error=error))
            spine.append(nid)
            continue
        index = item
        step = steps[index]
        sid = step_id(index)
        if step is None:
            label = f"ops[{index}]: invalid step"
            view.nodes.append(Node(sid, label, "invalid", error=errors.get(index, "unusable step")))
        elif step.kind == "module":
            ended = fuser_after_module.get(index)
            split = f"splits fuser {ended} | fuser {ended + 1}" if ended is not None else "ends the fuser"
            label = f"{step.name}\n{step.type} (module: {split})"
            view.nodes.append(Node(sid, label, "module", error=errors.get(index)))
        else:
            label = f"{step.name}\n{step.type}"
            view.nodes.append(Node(sid, label, "op", step.fuser, errors.get(index)))
            if step.fuser is not None:
                view.clusters.setdefault(step.fuser, []).append(sid)
        spine.append(sid)
    view.nodes.append(Node("y", "y", "y"))
    spine.append("y")
    view.edges.extend(Edge(a, b, "spine") for a, b in itertools.pairwise(spine))
    _ChannelEdges(view, steps, producer_of, marks, shown, {r.channel: r for r in reroutes}).draw()
    return view


def _block_id(item: Uses) -> str:
    return f"b{item.steps.start}"


def _reroute_note(item: Uses, steps: Sequence[PlannedStep | None], reroutes: Sequence[Reroute]) -> str:
    """What each use of a collapsed item reroutes (the same in every use, fusers counted from the
    channel's producer's): ``residual: fuser +0 -> +1 across attn (Attention)``."""
    first = item.uses[0]
    prefix = item.group.prefix(first.index)
    notes = []
    for r in reroutes:
        if r.channel.startswith(prefix) and r.consumers and r.consumers[0].step in first.steps:
            crossed = [s for s in (steps[i] for i in r.crosses) if s is not None]
            modules = ", ".join(f"{local_name(s.name, item.group, first)} ({s.type})" for s in crossed)
            later = ", ".join(f"+{f - r.producer_fuser}" for f in r.consumer_fusers)
            notes.append(f"{local_name(r.channel, item.group, first)}: fuser +0 -> {later} across {modules}")
    return ("\nrerouted in each use: " + "; ".join(notes)) if notes else ""


class _ChannelEdges:
    """The channel edges of a view: each extra input from its producer (or a red missing node, or a
    red edge for a slot the validator rejected), a rerouted edge across fusers, and the public inputs
    and outputs. A step inside a collapsed item is drawn as that item's node; what the item's uses do
    alike (their own channels, their public tensors) is drawn once, named use-relative
    (``layers[0-3].res``)."""

    def __init__(
        self,
        view: GraphView,
        steps: Sequence[PlannedStep | None],
        producer_of: Callable[[int, int], SlotRef | None],
        marks: Sequence[Diagnostic],
        shown: Outline,
        reroutes: Mapping[str, Reroute],
    ) -> None:
        self.view, self.steps, self.producer_of, self.shown, self.reroutes = (
            view,
            steps,
            producer_of,
            shown,
            reroutes,
        )
        self.ops = [s for s in steps if s is not None and s.kind == "op"]
        self.by_index = {s.index: s for s in self.ops}
        # The validator already judged each consumer slot; the drawing only shows its verdict.
        self.slot_errors = {d.path: d.message for d in marks if d.is_error}
        # Node ids are numbered, never derived from names: channel names may hold any character, and any
        # name-to-id mapping (``a b`` -> ``a_b``) would merge distinct tensors. Names stay in the labels.
        self.missing_ids: dict[str, str] = {}
        self.inputs, self.outputs = itertools.count(), itertools.count()
        self.drawn: set[tuple[str, str, str]] = set()  # (source, destination, label) of collapsed items

    def draw(self) -> None:
        for step in self.ops:
            for slot in range(len(step.input_channels)):
                self._input(step, slot)
        for step in self.ops:
            for slot, is_public in enumerate(step.output_public):
                if is_public:
                    self._public_output(step, slot)

    def _node_of(self, index: int) -> str:
        item = self.shown.item_of(index)
        return _block_id(item) if item is not None else step_id(index)

    def _add(self, edge: Edge, collapsed: bool) -> None:
        if collapsed:
            key = (edge.src, edge.dst, edge.label)
            if key in self.drawn:
                return
            self.drawn.add(key)
        self.view.edges.append(edge)

    def _input(self, step: PlannedStep, slot: int) -> None:
        dst, channel = self._node_of(step.index), step.input_channels[slot]
        inside = self.shown.item_of(step.index) is not None
        dst_slot = step.input_slots[slot].name
        if channel is None:
            public = self.shown.local(step.index, step.public_input_name(slot))
            if inside and (f"in:{public}", dst, public) in self.drawn:
                return
            self.drawn.add((f"in:{public}", dst, public))
            nid = f"in{next(self.inputs)}"
            self.view.nodes.append(Node(nid, public, "public_input"))
            self.view.edges.append(Edge(nid, dst, "public", public, None, dst_slot))
            return
        why = self.slot_errors.get(f"model.ops[{step.index}].extra_inputs.{dst_slot}")
        ref = self.producer_of(step.index, slot)
        producer = self.by_index.get(ref.step) if ref is not None else None
        label = self.shown.local(step.index, channel)
        if ref is None or producer is None:
            self._missing(label, dst, dst_slot, why or f"no producer of {channel!r}", inside)
            return
        src, src_slot = self._node_of(producer.index), ref.slot_name
        if why is not None:
            self._add(Edge(src, dst, "error", label, src_slot, dst_slot, why), inside)
            return
        if src == dst:  # inside one collapsed item: its label says what its uses reroute
            return
        route = self.reroutes.get(channel)
        if route is not None or producer.fuser != step.fuser:  # carried across modules
            where = (
                self.shown.describe(route, self.steps)
                if route is not None
                else f"fuser {producer.fuser} -> {step.fuser}"
            )
            self._add(Edge(src, dst, "rerouted", f"{label} (rerouted: {where})", src_slot, dst_slot), inside)
            return
        kind: EdgeKind = "public" if producer.output_public[ref.slot] else "internal"
        self._add(Edge(src, dst, kind, label, src_slot, dst_slot), inside)

    def _missing(self, label: str, dst: str, dst_slot: str, why: str, inside: bool) -> None:
        nid = self.missing_ids.get(label, f"missing{len(self.missing_ids)}")
        if label not in self.missing_ids:
            self.missing_ids[label] = nid
            self.view.nodes.append(Node(nid, f"missing channel '{label}'", "missing", error=why))
        self._add(Edge(nid, dst, "error", label, None, dst_slot, why), inside)

    def _public_output(self, step: PlannedStep, slot: int) -> None:
        src = self._node_of(step.index)
        inside = self.shown.item_of(step.index) is not None
        out_name = self.shown.local(step.index, step.public_output_name(slot))
        if inside and (src, f"out:{out_name}", out_name) in self.drawn:
            return
        self.drawn.add((src, f"out:{out_name}", out_name))
        nid = f"out{next(self.outputs)}"
        self.view.nodes.append(Node(nid, out_name, "public_output"))
        self.view.edges.append(Edge(src, nid, "public", out_name, step.output_slots[slot].name, None))


__all__ = [
    "Edge",
    "EdgeKind",
    "GraphView",
    "Node",
    "NodeKind",
    "build_view",
    "step_id",
    "view_from_analysis",
    "view_from_plan",
]
