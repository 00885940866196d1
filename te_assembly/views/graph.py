"""The channel graph as a picture: Mermaid and Graphviz DOT text, SVG/PNG through the ``dot`` binary,
from the view ``graph_view.py`` builds (a config with errors still draws, its problems in red).
Pure Python (no torch).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from te_assembly.diagnostics import printable
from te_assembly.errors import ArgumentError, ConfigError, MissingToolError
from te_assembly.fields import FieldSpec, check_value
from te_assembly.files.write import prepare_out_dir, write_text_atomic
from te_assembly.sections import section_specs, setting
from te_assembly.views.graph_view import (
    Edge,
    EdgeKind,
    GraphView,
    Node,
    NodeKind,
    build_view,
    step_id,
    view_from_analysis,
    view_from_plan,
)
from te_assembly.views.outline import EXPAND_DOC

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


__all__ = [
    "FORMATS",
    "NO_GRAPHVIZ",
    "Edge",
    "GraphSettings",
    "GraphView",
    "Node",
    "RenderResult",
    "build_view",
    "dot_binary",
    "file_stem",
    "render",
    "render_file",
    "step_id",
    "to_dot",
    "to_mermaid",
    "view_from_analysis",
    "view_from_plan",
]
