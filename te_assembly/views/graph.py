"""The channel graph as a picture: Mermaid and Graphviz DOT text, SVG/PNG through the ``dot`` binary.

Pure Python (no torch). The drawing is built from the validator's steps, so a config with errors still
draws: whatever could be planned is shown and each problem is marked in red (a dangling input as a red
node named after the missing channel, a channel crossing a fuser boundary as a red edge).
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from te_assembly.analysis.analyze import Analysis
from te_assembly.analysis.plan import BlockGroup, FuserGroup, Plan, PlannedStep, Reroute, SlotRef
from te_assembly.diagnostics import Diagnostic, printable
from te_assembly.errors import ArgumentError, ConfigError, MissingToolError
from te_assembly.fields import FieldSpec, check_value
from te_assembly.outputs import prepare_out_dir, write_text_atomic
from te_assembly.sections import section_specs, setting
from te_assembly.views.outline import EXPAND_DOC, Expand, Outline, Uses, local_name

NodeKind = Literal["x", "y", "op", "module", "block", "invalid", "public_input", "public_output", "missing"]
EdgeKind = Literal["spine", "internal", "public", "rerouted", "error"]

FORMATS = ("mermaid", "dot", "svg", "png")
SUFFIX = {"mermaid": "mmd", "dot": "dot", "svg": "svg", "png": "png"}


@dataclass(frozen=True)
class GraphSettings:
    """The ``graph:`` section."""

    out_dir: str | int | None = setting(
        None, doc="where <model>.mmd/.dot/.svg/.png go (null: the run directory)", nonempty=True
    )
    formats: list[str] = setting(
        [*FORMATS],
        doc="formats to write, a list or one name; svg/png need Graphviz's dot",
        items=FieldSpec(str, choices=FORMATS),
        single_as_list=True,
        nonempty=True,
    )
    expand: list[str] = setting([], doc=EXPAND_DOC, items=FieldSpec(str), single_as_list=True)

    @property
    def chosen_formats(self) -> list[str]:
        """The formats, each once, in the order given."""
        return list(dict.fromkeys(self.formats))


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
    _channel_edges(view, steps, producer_of, marks, shown, {r.channel: r for r in reroutes})
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


def _channel_edges(
    view: GraphView,
    steps: Sequence[PlannedStep | None],
    producer_of: Callable[[int, int], SlotRef | None],
    marks: Sequence[Diagnostic],
    shown: Outline,
    reroutes: Mapping[str, Reroute],
) -> None:
    ops = [s for s in steps if s is not None and s.kind == "op"]
    by_index = {s.index: s for s in ops}

    # A step inside a collapsed item is drawn as that item's node; what the item's uses do alike
    # (their own channels, their public tensors) is drawn once, named use-relative (``layers[0-3].res``).
    def node_of(index: int) -> str:
        item = shown.item_of(index)
        return _block_id(item) if item is not None else step_id(index)

    # The validator already judged each consumer slot; the drawing only shows its verdict.
    slot_errors = {d.path: d.message for d in marks if d.is_error}
    # Node ids are numbered, never derived from names: channel names may hold any character, and any
    # name-to-id mapping (``a b`` -> ``a_b``) would merge distinct tensors. Names stay in the labels.
    missing_ids: dict[str, str] = {}
    inputs = itertools.count()
    drawn: set[tuple[str, str, str]] = set()  # (source, destination, label) of a collapsed item's edges

    def add(edge: Edge, collapsed: bool) -> None:
        if collapsed:
            key = (edge.src, edge.dst, edge.label)
            if key in drawn:
                return
            drawn.add(key)
        view.edges.append(edge)

    for step in ops:
        dst = node_of(step.index)
        inside = shown.item_of(step.index) is not None
        for slot, channel in enumerate(step.input_channels):
            dst_slot = step.input_slots[slot].name
            if channel is None:
                public = shown.local(step.index, step.public_input_name(slot))
                if inside and (f"in:{public}", dst, public) in drawn:
                    continue
                drawn.add((f"in:{public}", dst, public))
                nid = f"in{next(inputs)}"
                view.nodes.append(Node(nid, public, "public_input"))
                view.edges.append(Edge(nid, dst, "public", public, None, dst_slot))
                continue
            why = slot_errors.get(f"model.ops[{step.index}].extra_inputs.{dst_slot}")
            ref = producer_of(step.index, slot)
            producer = by_index.get(ref.step) if ref is not None else None
            label = shown.local(step.index, channel)
            if ref is None or producer is None:
                missing = why or f"no producer of {channel!r}"
                nid = missing_ids.get(label, f"missing{len(missing_ids)}")
                if label not in missing_ids:
                    missing_ids[label] = nid
                    view.nodes.append(Node(nid, f"missing channel '{label}'", "missing", error=missing))
                add(Edge(nid, dst, "error", label, None, dst_slot, missing), inside)
                continue
            src, src_slot = node_of(producer.index), ref.slot_name
            if why is not None:
                add(Edge(src, dst, "error", label, src_slot, dst_slot, why), inside)
                continue
            if src == dst:  # inside one collapsed item: its label says what its uses reroute
                continue
            route = reroutes.get(channel)
            if route is not None or producer.fuser != step.fuser:  # carried across modules
                where = (
                    shown.describe(route, steps)
                    if route is not None
                    else f"fuser {producer.fuser} -> {step.fuser}"
                )
                add(Edge(src, dst, "rerouted", f"{label} (rerouted: {where})", src_slot, dst_slot), inside)
                continue
            kind: EdgeKind = "public" if producer.output_public[ref.slot] else "internal"
            add(Edge(src, dst, kind, label, src_slot, dst_slot), inside)

    outputs = itertools.count()
    for step in ops:
        src = node_of(step.index)
        inside = shown.item_of(step.index) is not None
        for slot, is_public in enumerate(step.output_public):
            if not is_public:
                continue
            out_name = shown.local(step.index, step.public_output_name(slot))
            if inside and (src, f"out:{out_name}", out_name) in drawn:
                continue
            drawn.add((src, f"out:{out_name}", out_name))
            nid = f"out{next(outputs)}"
            view.nodes.append(Node(nid, out_name, "public_output"))
            src_slot = step.output_slots[slot].name
            view.edges.append(Edge(src, nid, "public", out_name, src_slot, None))


# ----------------------------------------------------------------------------------------------- Mermaid

_MERMAID_SHAPES: dict[NodeKind, tuple[str, str]] = {
    "x": ("([", "])"),
    "y": ("([", "])"),
    "op": ("[", "]"),
    "module": ("[[", "]]"),
    "block": ("[[", "]]"),
    "invalid": ("[", "]"),
    "public_input": ("[/", "/]"),
    "public_output": ("[\\", "\\]"),
    "missing": ("{{", "}}"),
}
_MERMAID_ARROWS: dict[EdgeKind, str] = {
    "spine": "-->",
    "internal": "-.->",
    "public": "==>",
    "rerouted": "-.->",
    "error": "-.->",
}
_REROUTED = "#9467bd"
_RED = "#d62728"


# Mermaid renders labels as HTML: a channel named ``<b>`` would become markup. Its entity codes
# (``#name;`` / ``#number;``) keep every character literal, ``#`` itself included.
_MERMAID_ENTITIES = {"#": "#35;", '"': "#quot;", "&": "#amp;", "<": "#lt;", ">": "#gt;"}


def _mermaid_text(text: str) -> str:
    # Control characters from a config's names become visible escapes (``\x1b``), never raw bytes.
    escaped = "".join(_MERMAID_ENTITIES.get(c, c) for c in printable(text, keep_newlines=True))
    return '"' + escaped.replace("\n", "<br/>") + '"'


def _edge_text(edge: Edge) -> str:
    slots = [s for s in (edge.src_slot, edge.dst_slot) if s is not None and s != edge.label]
    if not slots:
        return edge.label
    return f"{edge.label} ({edge.src_slot or '·'} → {edge.dst_slot or '·'})"


def to_mermaid(view: GraphView) -> str:
    comment = printable(" ".join(view.name.splitlines()))  # a line break would end the comment
    lines = ["flowchart LR", f"  %% {comment}: te_assembly channel graph"]
    clustered = {nid for ids in view.clusters.values() for nid in ids}

    def node_line(node: Node, indent: str) -> str:
        left, right = _MERMAID_SHAPES[node.kind]
        return f"{indent}{node.id}{left}{_mermaid_text(node.label)}{right}"

    by_id = {n.id: n for n in view.nodes}
    for node in view.nodes:
        if node.id not in clustered:
            lines.append(node_line(node, "  "))
    for fuser, ids in view.clusters.items():
        lines.append(f"  subgraph fuser{fuser}[{_mermaid_text(view.cluster_labels[fuser])}]")
        lines.extend(node_line(by_id[nid], "    ") for nid in ids)
        lines.append("  end")
    red_links: list[int] = []
    rerouted_links: list[int] = []
    for i, edge in enumerate(view.edges):
        arrow = _MERMAID_ARROWS[edge.kind]
        text = _edge_text(edge)
        label = f"|{_mermaid_text(text)}|" if text else ""
        lines.append(f"  {edge.src} {arrow}{label} {edge.dst}")
        if edge.kind == "error":
            red_links.append(i)
        elif edge.kind == "rerouted":
            rerouted_links.append(i)
    lines.append("  classDef public_input fill:#e8f0fe,stroke:#1f77b4")
    lines.append("  classDef public_output fill:#e6f4ea,stroke:#2ca02c")
    lines.append("  classDef module fill:#fff4e5,stroke:#ff7f0e")
    lines.append(f"  classDef block fill:#f3e8fd,stroke:{_REROUTED}")
    lines.append(f"  classDef error fill:#fdecea,stroke:{_RED},color:{_RED},stroke-width:2px")
    for kind in ("public_input", "public_output", "module", "block"):
        ids = [n.id for n in view.nodes if n.kind == kind and n.error is None]
        if ids:
            lines.append(f"  class {','.join(ids)} {kind}")
    bad = [n.id for n in view.nodes if n.error is not None]
    if bad:
        lines.append(f"  class {','.join(bad)} error")
    if rerouted_links:
        links = ",".join(map(str, rerouted_links))
        lines.append(f"  linkStyle {links} stroke:{_REROUTED},color:{_REROUTED},stroke-width:2px")
    if red_links:
        lines.append(
            f"  linkStyle {','.join(map(str, red_links))} stroke:{_RED},color:{_RED},stroke-width:2px"
        )
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------- DOT

_DOT_NODE: dict[NodeKind, str] = {
    "x": 'shape=oval, style=filled, fillcolor="#eeeeee"',
    "y": 'shape=oval, style=filled, fillcolor="#eeeeee"',
    "op": 'shape=box, style="rounded,filled", fillcolor=white',
    "module": 'shape=component, style=filled, fillcolor="#fff4e5", color="#ff7f0e"',
    "block": 'shape=box3d, style=filled, fillcolor="#f3e8fd", color="#9467bd"',
    "invalid": "shape=box, style=dashed",
    "public_input": 'shape=invhouse, style=filled, fillcolor="#e8f0fe", color="#1f77b4"',
    "public_output": 'shape=house, style=filled, fillcolor="#e6f4ea", color="#2ca02c"',
    "missing": "shape=octagon, style=filled",
}
_DOT_EDGE: dict[EdgeKind, str] = {
    "spine": "penwidth=2.5, weight=100",
    "internal": 'style=dashed, color="#555555", constraint=false',
    "public": 'style=bold, penwidth=2, color="#1f77b4"',
    "rerouted": f'style=dashed, penwidth=2, color="{_REROUTED}", fontcolor="{_REROUTED}", constraint=false',
    "error": f'style=bold, penwidth=2, color="{_RED}", fontcolor="{_RED}", constraint=false',
}


# Graphviz decodes HTML entities even in quoted strings (``"&lt;"`` draws ``<``), so ``&`` is escaped for
# a name to be drawn as written; ``<`` and ``>`` too, so no output format ever sees markup.
_DOT_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def _dot_str(text: str) -> str:
    escaped = "".join(_DOT_ENTITIES.get(c, c) for c in printable(text, keep_newlines=True))
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(view: GraphView) -> str:
    lines = [
        f"digraph {_dot_str(view.name)} {{",
        "  rankdir=LR;",
        "  compound=true;",
        '  node [fontname="Helvetica", fontsize=11];',
        '  edge [fontname="Helvetica", fontsize=9];',
    ]
    clustered = {nid for ids in view.clusters.values() for nid in ids}
    by_id = {n.id: n for n in view.nodes}

    def node_line(node: Node) -> str:
        attrs = f"label={_dot_str(node.label)}, {_DOT_NODE[node.kind]}"
        if node.error is not None:
            attrs += f', color="{_RED}", fontcolor="{_RED}", fillcolor="#fdecea", penwidth=2'
            attrs += f", tooltip={_dot_str(node.error)}"
        return f"{node.id} [{attrs}];"

    for node in view.nodes:
        if node.id not in clustered:
            lines.append("  " + node_line(node))
    for fuser, ids in view.clusters.items():
        lines.append(f"  subgraph cluster_fuser{fuser} {{")
        lines.append(f"    label={_dot_str(view.cluster_labels[fuser])};")
        lines.append('    style="rounded,filled"; fillcolor="#f5f8ff"; color="#7f9cc9";')
        lines.extend("    " + node_line(by_id[nid]) for nid in ids)
        lines.append("  }")
    for edge in view.edges:
        attrs = [_DOT_EDGE[edge.kind]]
        if edge.label:
            attrs.append(f"label={_dot_str(edge.label)}")
        if edge.src_slot is not None and edge.src_slot != edge.label:
            attrs.append(f"taillabel={_dot_str(edge.src_slot)}")
        if edge.dst_slot is not None and edge.dst_slot != edge.label:
            attrs.append(f"headlabel={_dot_str(edge.dst_slot)}")
        if edge.error is not None:
            attrs.append(f"tooltip={_dot_str(edge.error)}")
        lines.append(f"  {edge.src} -> {edge.dst} [{', '.join(attrs)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------- files


@dataclass
class RenderResult:
    written: dict[str, Path] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    """Format -> why it was not written."""


def dot_binary() -> str | None:
    return shutil.which("dot")


def file_stem(name: str) -> str:
    """A model name as a file name (characters a path could trip on become ``_``)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name).strip(".") or "model"


def render(
    view: GraphView, out_dir: str | Path, formats: Sequence[str] = FORMATS, stem: str | None = None
) -> RenderResult:
    """Write ``<stem>.mmd``, ``<stem>.dot`` and, when Graphviz's ``dot`` is on PATH, SVG/PNG (``stem``:
    the model's name by default; the ``graph`` command passes the model *choice*, so two configs never
    share file names). Raises ``ConfigError`` for an unknown format and ``OutputPathError`` when
    ``out_dir`` cannot be written."""
    if isinstance(formats, str):
        formats = [formats]  # one format, not one per character
    problems = check_value(section_specs(GraphSettings)["formats"], list(formats), "formats")
    if problems:
        raise ConfigError(problems)
    out = prepare_out_dir(out_dir)
    result = RenderResult()
    base = stem or file_stem(view.name)
    texts: dict[str, str] = {}
    for fmt in formats:
        path = out / f"{base}.{SUFFIX[fmt]}"
        why = _write_format(view, fmt, path, texts)
        if why is None:
            result.written[fmt] = path
        else:
            result.skipped[fmt] = why
    return result


NO_GRAPHVIZ = "Graphviz's 'dot' is not on PATH (install graphviz, e.g. apt-get install graphviz)"


def _write_format(view: GraphView, fmt: str, path: Path, texts: dict[str, str]) -> str | None:
    """Write ``view`` as ``fmt`` to ``path``; the reason when it cannot be drawn (no Graphviz, or
    ``dot`` failed). ``texts`` caches the Mermaid and DOT text between formats."""
    if "dot" not in texts:
        texts["dot"] = to_dot(view)
    if fmt in ("mermaid", "dot"):
        text = texts.get(fmt) or texts.setdefault(fmt, to_mermaid(view))
        write_text_atomic(path, text)  # OutputPathError when it cannot be written
        return None
    binary = dot_binary()
    if binary is None:
        return NO_GRAPHVIZ
    proc = subprocess.run(
        [binary, f"-T{fmt}", "-o", str(path)], input=texts["dot"], text=True, capture_output=True, check=False
    )
    if proc.returncode != 0:
        return f"dot -T{fmt} failed: {proc.stderr.strip() or proc.returncode}"
    return None


def render_file(view: GraphView, path: str | os.PathLike[str]) -> Path:
    """Draw ``view`` into one file, the format from its suffix: ``.mmd`` (Mermaid), ``.dot`` (DOT),
    ``.svg`` or ``.png`` (drawn by Graphviz's ``dot``). Raises ``ArgumentError`` for another suffix,
    ``MissingToolError`` when SVG/PNG is asked for without Graphviz, ``OutputPathError`` when the file
    cannot be written."""
    target = Path(path)
    by_suffix = {f".{suffix}": fmt for fmt, suffix in SUFFIX.items()}
    fmt = by_suffix.get(target.suffix.lower())
    if fmt is None:
        shown = ", ".join(by_suffix)
        raise ArgumentError(f"cannot tell the format of {str(target)!r} from its suffix: use one of {shown}")
    if target.parent != Path():
        prepare_out_dir(target.parent)
    why = _write_format(view, fmt, target, {})
    if why == NO_GRAPHVIZ:
        raise MissingToolError(
            f"drawing {target.name} needs Graphviz: {NO_GRAPHVIZ}; .mmd and .dot files need nothing"
        )
    if why is not None:
        raise MissingToolError(f"cannot draw {target}: {why}")
    return target
