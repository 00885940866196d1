"""The channel graph drawing: every channel edge, fuser cluster, public tensor and splitting module;
a broken config still draws, with the problem in red, and the command exits 2."""

from __future__ import annotations

import html
import itertools
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from te_assembly.analysis.pipeline import load
from te_assembly.analysis.plan import Plan
from te_assembly.cli.main import main as cli_main
from te_assembly.views.graph import (
    GraphView,
    RenderResult,
    render,
    to_dot,
    to_mermaid,
    view_from_analysis,
    view_from_plan,
)

RED = "#d62728"


def _dot_edges(dot: str) -> list[tuple[str, str, str]]:
    """(src, dst, attributes) of every edge statement."""
    return re.findall(r"^\s*(\w+) -> (\w+) \[(.*)\];$", dot, flags=re.M)


def _mermaid_edges(text: str) -> list[tuple[str, str, str, str]]:
    """(src, arrow, label, dst) of every link."""
    return re.findall(r'^\s*(\w+) (-->|-\.->|==>)(?:\|"(.*?)"\|)? (\w+)$', text, flags=re.M)


def _expected_channel_edges(plan: Plan) -> set[tuple[str, str, str]]:
    return {
        (f"s{c.producer.step}", f"s{ref.step}", name)
        for name, c in plan.channels.items()
        for ref in c.consumers
    }


@pytest.mark.parametrize("model", ["moe_block", "two_stage", "fanout_mlp"])
def test_every_channel_edge_and_cluster_is_drawn(model: str) -> None:
    plan = load(model).checked_plan()
    view = view_from_plan(plan)
    dot, mermaid = to_dot(view), to_mermaid(view)
    expected = _expected_channel_edges(plan)
    assert expected, "the shipped model should have channels"

    dot_channels = {
        (s, d, re.search(r'label="([^"]*)"', a).group(1))  # type: ignore[union-attr]
        for s, d, a in _dot_edges(dot)
        if "style=dashed" in a or ("style=bold" in a and d.startswith("s"))
    }
    assert expected <= dot_channels
    mermaid_channels = {
        (s, d, label.split(" (")[0]) for s, arrow, label, d in _mermaid_edges(mermaid) if label
    }
    assert expected <= mermaid_channels
    # Internal channels dashed, public ones bold, in both renderings.
    for name, c in plan.channels.items():
        for ref in c.consumers:
            src, dst = f"s{c.producer.step}", f"s{ref.step}"
            attrs = next(a for s, d, a in _dot_edges(dot) if (s, d) == (src, dst) and f'label="{name}"' in a)
            assert ("style=bold" if c.public else "style=dashed") in attrs
            arrow = next(
                ar
                for s, ar, lab, d in _mermaid_edges(mermaid)
                if (s, d) == (src, dst) and lab.startswith(name)
            )
            assert arrow == ("==>" if c.public else "-.->")

    for fuser in plan.fusers:
        assert f"subgraph cluster_fuser{fuser.index} {{" in dot
        assert f"subgraph fuser{fuser.index}[" in mermaid
        block = dot.split(f"subgraph cluster_fuser{fuser.index} {{")[1].split("}")[0]
        for step in fuser.steps:
            assert re.search(rf"^\s*s{step} \[", block, flags=re.M), f"step {step} outside its cluster"


@pytest.mark.parametrize("model", ["moe_block", "two_stage"])
def test_spine_and_public_tensors(model: str) -> None:
    plan = load(model).checked_plan()
    view = view_from_plan(plan)
    dot, mermaid = to_dot(view), to_mermaid(view)
    spine = ["x", *(f"s{s.index}" for s in plan.steps), "y"]
    mermaid_links = {(s, d) for s, arrow, _, d in _mermaid_edges(mermaid) if arrow == "-->"}
    dot_links = {(s, d) for s, d, a in _dot_edges(dot) if "weight=100" in a}
    for pair in itertools.pairwise(spine):
        assert pair in mermaid_links and pair in dot_links
    assert [n.label for n in view.nodes_of("public_input")] == [t.name for t in plan.public_inputs]
    assert [n.label for n in view.nodes_of("public_output")] == [t.name for t in plan.public_outputs]
    for node, t in zip(view.nodes_of("public_input"), plan.public_inputs, strict=True):
        assert re.search(rf"^\s*{node.id} \[label=\"{t.name}\", shape=invhouse", dot, flags=re.M)
        assert f'{node.id}[/"{t.name}"/]' in mermaid
        assert (node.id, f"s{t.ref.step}") in {(s, d) for s, d, _ in _dot_edges(dot)}
    for node, t in zip(view.nodes_of("public_output"), plan.public_outputs, strict=True):
        assert re.search(rf"^\s*{node.id} \[label=\"{t.name}\", shape=house", dot, flags=re.M)
        assert (f"s{t.ref.step}", node.id) in {(s, d) for s, _, _, d in _mermaid_edges(mermaid)}
    assert plan.public_inputs or plan.public_outputs


def test_splitting_module_is_drawn_between_clusters() -> None:
    plan = load("two_stage").checked_plan()
    view = view_from_plan(plan)
    dot = to_dot(view)
    module = next(s for s in plan.steps if s.kind == "module")
    before = plan.fusers[0]
    assert before.ended_by == module.index
    node = view.node(f"s{module.index}")
    assert node.kind == "module" and "splits fuser 0 | fuser 1" in node.label
    # Declared outside every cluster, linked from fuser 0's last step and to fuser 1's first.
    outside = dot.split("subgraph cluster_fuser0")[0]
    assert re.search(rf"^\s*s{module.index} \[.*shape=component", outside, flags=re.M)
    edges = {(s, d) for s, d, _ in _dot_edges(dot)}
    assert (f"s{before.steps[-1]}", f"s{module.index}") in edges
    assert (f"s{module.index}", f"s{plan.fusers[1].steps[0]}") in edges


def test_dangling_and_backward_channels_are_red() -> None:
    loaded = load(
        "two_stage",
        ["model.ops.3.extra_inputs.addend=stage2_in", "model.ops.8.extra_inputs.addend=stage2_inn"],
    )
    view = view_from_analysis(loaded)
    assert view.has_errors
    dot, mermaid = to_dot(view), to_mermaid(view)
    [missing] = view.nodes_of("missing")
    assert "stage2_inn" in missing.label and missing.error
    assert re.search(rf'^\s*{missing.id} \[.*color="{RED}"', dot, flags=re.M)
    dangling = [a for s, d, a in _dot_edges(dot) if (s, d) == (missing.id, "s8")]
    assert len(dangling) == 1 and RED in dangling[0] and 'label="stage2_inn"' in dangling[0]
    # Read in fuser 0 from a producer in fuser 1: no earlier producer (the other way round is rerouted).
    backward = [a for s, d, a in _dot_edges(dot) if (s, d) == ("s5", "s3")]
    assert len(backward) == 1 and RED in backward[0] and "in a later fuser (1)" in backward[0]
    # Mermaid: the same two links are styled red by index.
    links = _mermaid_edges(mermaid)
    red = {i for i, (s, _, _, d) in enumerate(links) if (s, d) in {(missing.id, "s8"), ("s5", "s3")}}
    styled = re.search(r"^\s*linkStyle ([\d,]+) stroke:" + RED, mermaid, flags=re.M)
    assert styled is not None and set(map(int, styled.group(1).split(","))) == red
    assert re.search(rf"^\s*class .*\b{missing.id}\b.* error$", mermaid, flags=re.M)


def test_cli_draws_a_broken_config_then_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    out = tmp_path / "g"
    rc = cli_main(
        ["graph", "model=residual_mlp", "model.ops.5.extra_inputs.addend=resdual", f"graph.out_dir={out}"]
    )
    captured = capsys.readouterr()
    assert rc == 2
    assert "channel 'resdual' consumed by step 'add_residual' has no producer" in captured.err
    assert "missing channel 'resdual'" in captured.out  # the Mermaid text went to stdout
    dot = (out / "residual_mlp.dot").read_text()
    assert re.search(rf'^\s*missing0 \[label="missing channel \'resdual\'".*color="{RED}"', dot, flags=re.M)
    assert (out / "residual_mlp.mmd").read_text() == captured.out


def test_cli_valid_config_exits_0_and_writes_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    rc = cli_main(["graph", "model=moe_block", f"graph.out_dir={tmp_path}", "graph.formats=[mermaid,dot]"])
    captured = capsys.readouterr()
    assert rc == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "moe_block.dot", "moe_block.mmd"]
    assert captured.out.startswith("flowchart LR")


def test_svg_png_skipped_with_reason_without_graphviz(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("te_assembly.views.graph.dot_binary", lambda: None)
    result: RenderResult = render(view_from_plan(load("moe_block").checked_plan()), tmp_path)
    assert set(result.written) == {"mermaid", "dot"}
    assert set(result.skipped) == {"svg", "png"}
    assert all("dot" in why and "not on PATH" in why for why in result.skipped.values())
    assert not list(tmp_path.glob("*.svg")) and not list(tmp_path.glob("*.png"))


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz 'dot' binary not installed")
@pytest.mark.parametrize(
    "overrides",
    [
        ["model=moe_block"],
        ["model=two_stage"],
        ["model=two_stage", "model.ops.3.extra_inputs.addend=stage2_in"],
    ],
)
def test_dot_parses_with_graphviz(overrides: list[str], tmp_path: Path) -> None:
    view = view_from_analysis(load(None, overrides))
    proc = subprocess.run(["dot", "-Tsvg"], input=to_dot(view), capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "", proc.stderr  # no syntax warnings either
    assert "<svg" in proc.stdout
    result = render(view, tmp_path)
    assert set(result.written) == {"mermaid", "dot", "svg", "png"}
    assert result.written["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_graph_module_does_not_import_torch() -> None:
    code = "import sys, te_assembly.views.graph; assert 'torch' not in sys.modules, 'graph imported torch'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_public_outputs_differing_only_in_space_vs_underscore_get_their_own_nodes() -> None:
    model = {
        "name": "twins",
        "in_features": 4,
        "ops": [
            {
                "name": "tap1",
                "op": "MakeExtraOutput",
                "extra_outputs": {"out": {"channel": "a b", "public": True}},
            },
            {
                "name": "tap2",
                "op": "MakeExtraOutput",
                "extra_outputs": {"out": {"channel": "a_b", "public": True}},
            },
        ],
    }
    view = view_from_analysis(load(model))
    assert not view.has_errors, view.diagnostics
    outs = view.nodes_of("public_output")
    assert [n.label for n in outs] == ["a b", "a_b"]
    assert len({n.id for n in view.nodes}) == len(view.nodes)
    dot, mermaid = to_dot(view), to_mermaid(view)
    assert {(s, d) for s, d, _ in _dot_edges(dot)} >= {("s0", outs[0].id), ("s1", outs[1].id)}
    assert {(s, d) for s, _, _, d in _mermaid_edges(mermaid)} >= {("s0", outs[0].id), ("s1", outs[1].id)}
    for node in outs:
        assert len(re.findall(rf"^\s*{node.id} \[label=\"{node.label}\"", dot, flags=re.M)) == 1


HTML_NAMES = ["<b>&x", "#lt;&lt;"]
"""A name that is markup, and names that look like Mermaid's and HTML's entity codes."""


def _html_named_channels() -> GraphView:
    ops: list[dict[str, object]] = []
    for i, name in enumerate(HTML_NAMES):
        ops.append(
            {
                "name": f"tap{i}",
                "op": "MakeExtraOutput",
                "extra_outputs": {"out": {"channel": name, "public": True}},
            }
        )
        ops.append({"name": f"add{i}", "op": "AddExtraInput", "extra_inputs": {"addend": name}})
    view = view_from_analysis(load({"name": "html", "in_features": 4, "ops": ops}))
    assert not view.has_errors, view.diagnostics
    return view


def _mermaid_decode(label: str) -> str:
    """Mermaid's own decoding: one left-to-right pass turning ``#name;`` / ``#number;`` into HTML
    entities, which the browser then decodes."""

    def entity(m: re.Match[str]) -> str:
        code = m.group(1)
        return f"&#{code};" if code.isdigit() else f"&{code};"

    return html.unescape(re.sub(r"#(\w+);", entity, label))


def _quoted(text: str, escapes: str) -> list[str]:
    return re.findall(rf'"((?:{escapes}|[^"\\])*)"', text)


def test_html_like_channel_names_are_escaped_in_mermaid() -> None:
    mermaid = to_mermaid(_html_named_channels())
    labels = [label.replace("<br/>", "\n") for label in _quoted(mermaid, "(?!)")]
    assert labels
    for label in labels:
        assert not set(label) & set('<>&"'), label
    # The drawing shows each name as written once Mermaid decodes its entity codes.
    decoded = [_mermaid_decode(label) for label in labels]
    for name in HTML_NAMES:
        assert name in decoded  # the public output node
        assert f"{name} (out → addend)" in decoded  # the channel edge


def test_html_like_channel_names_are_escaped_in_dot() -> None:
    dot = to_dot(_html_named_channels())
    labels = _quoted(dot, r"\\.")
    for label in labels:
        assert not set(label) & set("<>"), label
        assert not re.search(r"&(?!(amp|lt|gt);)", label), label
    # Graphviz decodes entities in quoted strings: each name is drawn as written.
    decoded = {html.unescape(label) for label in labels}
    assert set(HTML_NAMES) <= decoded


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz 'dot' binary not installed")
def test_graphviz_draws_html_like_channel_names_as_text() -> None:
    proc = subprocess.run(
        ["dot", "-Tsvg"], input=to_dot(_html_named_channels()), capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and proc.stderr.strip() == "", proc.stderr
    texts = [html.unescape(t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", proc.stdout)]
    for name in HTML_NAMES:
        assert name in texts
    assert "<b>" not in proc.stdout


def test_an_empty_format_list_is_refused_not_read_as_all() -> None:
    from te_assembly.analysis.pipeline import load
    from te_assembly.cli.commands.graph import SECTIONS

    analysis = load("moe_block", ["graph.formats=[]"], sections={**SECTIONS})
    (d,) = [d for d in analysis.diagnostics if d.is_error]
    assert d.path == "graph.formats" and "at least one item" in d.message
