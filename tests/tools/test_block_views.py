"""``explain`` and ``graph`` of a model built from blocks: block steps collapsed to one row/node per run
of identical uses, ``explain.expand`` / ``graph.expand`` to show them step by step, and every rerouted
channel marked with the fusers and modules it crosses, collapsed and expanded."""

from __future__ import annotations

import io
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from te_assembly.analysis.pipeline import load
from te_assembly.analysis.plan import Plan
from te_assembly.views.explain import plan_tables, signature
from te_assembly.views.graph import to_dot, to_mermaid, view_from_analysis, view_from_plan
from te_assembly.views.outline import Expand, Uses, outline, parse_expand

RunCli = Callable[..., subprocess.CompletedProcess[str]]

# Each use: a residual tapped before a Tanh module and added back after it (rerouted from one fuser
# to the next); ``skip`` crosses every use's Tanh, from before the block step to after it.
MODEL = """
name: blocky
in_features: 8
blocks:
  layer:
    dims: {w: 8}
    ops:
      - {name: tap, op: MakeExtraOutput, extra_outputs: {out: {channel: res}}}
      - {name: up, op: Linear, args: {in_features: 8, out_features: "${block.dims.w}"}}
      - {name: act, module: Tanh}
      - {name: down, op: Linear, args: {in_features: "${block.dims.w}", out_features: 8}}
      - {name: add, op: AddExtraInput, extra_inputs: {addend: res}}
ops:
  - {name: pre, op: MakeExtraOutput, extra_outputs: {out: {channel: skip}}}
  - {name: layers, block: layer, USES}
  - {name: post, op: AddExtraInput, extra_inputs: {addend: skip}}
"""
REPEAT = MODEL.replace("USES", "repeat: 4")
# Uses 0-1 alike, use 2 wider, use 3 like 0-1 again: three collapsed runs.
PER_USE = MODEL.replace("USES", "uses: [{dims: {w: 8}}, {dims: {w: 8}}, {dims: {w: 16}}, {}]")


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "blocky.yaml"
    path.write_text(text)
    return path


def _plan(tmp_path: Path, text: str = REPEAT) -> Plan:
    return load(str(_write(tmp_path, text))).checked_plan()


def _text(plan: Plan, expand: Expand | None = None) -> str:
    out = io.StringIO()
    console = Console(file=out, width=400, no_color=True)
    for table in plan_tables(plan, expand):
        console.print(table)
    return out.getvalue()


def _steps_table(text: str) -> str:
    return text.split("\nblocks")[0]


def _labels(plan: Plan, expand: Expand) -> list[Any]:
    return [
        i.label if isinstance(i, Uses) else plan.steps[i].name
        for i in outline(len(plan.steps), plan.blocks, expand)
    ]


def test_explain_collapses_a_repeated_block_to_one_row(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    text = _text(plan)
    steps = _steps_table(text)
    use_params = sum(s.num_params for s in plan.steps if s.name.startswith("layers."))
    assert use_params > 0
    assert re.search(rf"│ 1-20 │ layers\[0-3\]\s+│ block layer x 4\s+│.*│\s+{use_params:,} │", steps)
    assert "layers.2.up" not in text and "layers.0.tap" not in text
    # Channels and public outputs of the uses once, use-relative.
    assert text.count("layers[0-3].res ") >= 2
    assert "layers.1.res" not in text
    assert signature(plan) == "model(x) -> (y, skip, layers[0-3].res)"
    # The steps table lists the model's own steps and one row for the block step, nothing else.
    rows = re.findall(r"^│\s+([\d-]+) │ (\S+)", steps, re.M)
    assert rows == [("0", "pre"), ("1-20", "layers[0-3]"), ("21", "post")]


def test_explain_expands_all_a_block_step_or_one_use(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    for names in (["all"], ["layers"]):
        expand, problems = parse_expand(names, plan.blocks, "explain.expand")
        assert problems == []
        text = _text(plan, expand)
        for s in plan.steps:
            assert re.search(rf"│\s+{s.index} │ {re.escape(s.name)}\s+│ {s.type}", text), s.name
        assert "layers[" not in text
        assert (
            signature(plan, expand)
            == "model(x) -> (y, skip, layers.0.res, layers.1.res, layers.2.res, layers.3.res)"
        )
    expand, problems = parse_expand(["layers.1"], plan.blocks, "explain.expand")
    assert problems == [] and expand.uses == frozenset({("layers", 1)})
    assert _labels(plan, expand) == [
        "pre",
        "layers[0]",
        *(f"layers.1.{s}" for s in ("tap", "up", "act", "down", "add")),
        "layers[2-3]",
        "post",
    ]
    text = _steps_table(_text(plan, expand))
    assert re.search(r"│\s+6 │ layers\.1\.tap\s+│", text) and "layers.0.tap" not in text
    assert re.search(r"│ 11-20 │ layers\[2-3\]\s+│ block layer x 2", text)


def test_uses_with_other_dims_do_not_collapse_together(tmp_path: Path) -> None:
    plan = _plan(tmp_path, PER_USE)
    assert [u.dims["w"] for u in plan.blocks[0].uses] == [8, 8, 16, 8]
    assert _labels(plan, Expand()) == ["pre", "layers[0-1]", "layers[2]", "layers[3]", "post"]
    text = _steps_table(_text(plan))
    wide = sum(s.num_params for s in plan.steps if s.name.startswith("layers.2."))
    narrow = sum(s.num_params for s in plan.steps if s.name.startswith("layers.0."))
    assert wide != narrow
    assert re.search(rf"│\s+11-15 │ layers\[2\]\s+│ block layer x 1\s+│.*│\s+{wide:,} │", text)
    assert re.search(rf"│\s+1-10 │ layers\[0-1\]\s+│ block layer x 2\s+│.*│\s+{2 * narrow:,} │", text)
    view = view_from_plan(plan)
    assert [n.label.split("\n")[0] for n in view.nodes_of("block")] == [
        "layers[0-1]",
        "layers[2]",
        "layers[3]",
    ]


def test_bad_expand_names_are_diagnostics_with_suggestions(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    _, problems = parse_expand(["layers", "layer", "layers.4", "all"], plan.blocks, "graph.expand")
    assert [(d.path, d.code) for d in problems] == [
        ("graph.expand[1]", "bad-choice"),
        ("graph.expand[2]", "out-of-range"),
    ]
    assert problems[0].hint == "did you mean 'layers'?"
    assert "0-3" in problems[1].message
    flat = load(
        {
            "name": "flat",
            "in_features": 4,
            "ops": [{"name": "a", "op": "ConstantScale", "args": {"scale": 2.0}}],
        }
    )
    _, problems = parse_expand(["layers"], flat.checked_plan().blocks, "explain.expand")
    assert len(problems) == 1 and "uses no blocks" in problems[0].message


def test_explain_marks_rerouted_channels_collapsed_and_expanded(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    routes = {r.channel: r for r in plan.reroutes}
    assert set(routes) == {"skip", *(f"layers.{i}.res" for i in range(4))}
    channels = _text(plan).split("\nchannels")[1]
    assert re.search(
        r"│ layers\[0-3\]\.res .*│ rerouted fuser \+0 -> \+1 across act \(Tanh\) \(in each use\)", channels
    )
    assert re.search(r"│ skip .*│ rerouted fuser 0 -> 4 across layers\[0-3\]\.act \(Tanh\)", channels)
    channels = _text(plan, Expand(everything=True)).split("\nchannels")[1]
    for i in range(4):
        r = routes[f"layers.{i}.res"]
        assert (r.producer_fuser, r.consumer_fusers) == (i, (i + 1,))
        assert re.search(
            rf"│ layers\.{i}\.res .*│ rerouted fuser {i} -> {i + 1} across layers\.{i}\.act \(Tanh\)",
            channels,
        )
    crossed = ", ".join(f"layers.{i}.act (Tanh)" for i in range(4))
    assert f"rerouted fuser 0 -> 4 across {crossed}" in " ".join(channels.split())
    assert channels.count("in its fuser") == 0


def test_graph_collapsed_draws_one_block_node_and_marks_reroutes(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    view = view_from_plan(plan)
    [block] = view.nodes_of("block")
    assert block.label.startswith("layers[0-3]\nblock layer x 4")
    assert "rerouted in each use: res: fuser +0 -> +1 across act (Tanh)" in block.label
    assert not view.nodes_of("missing") and all(e.kind != "error" for e in view.edges)
    assert not any(n.id.startswith("s") and n.label.startswith("layers.") for n in view.nodes)
    [skip] = [e for e in view.edges if e.kind == "rerouted"]
    assert (skip.src, skip.dst) == ("s0", "s21")
    assert skip.label == "skip (rerouted: fuser 0 -> 4 across layers[0-3].act (Tanh))"
    assert [n.label for n in view.nodes_of("public_output")] == ["skip", "layers[0-3].res"]
    spine = [(e.src, e.dst) for e in view.edges if e.kind == "spine"]
    assert spine == [("x", "s0"), ("s0", block.id), (block.id, "s21"), ("s21", "y")]
    mermaid = to_mermaid(view)
    index = view.edges.index(skip)
    assert f"linkStyle {index} stroke:#9467bd" in mermaid
    assert "rerouted: fuser 0 -#gt; 4 across layers[0-3].act (Tanh)" in mermaid
    assert f"class {block.id} block" in mermaid
    dot = to_dot(view)
    assert re.search(
        r's0 -> s21 \[style=dashed, penwidth=2, color="#9467bd".*label="skip \(rerouted: fuser 0 -&gt; 4', dot
    )


def test_graph_expanded_draws_every_step_and_each_rerouted_channel(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    view = view_from_plan(plan, Expand(everything=True))
    assert not view.nodes_of("block")
    assert len(view.nodes_of("op")) + len(view.nodes_of("module")) == len(plan.steps)
    rerouted = {e.label.split(" ")[0]: e for e in view.edges if e.kind == "rerouted"}
    assert set(rerouted) == {"skip", *(f"layers.{i}.res" for i in range(4))}
    for i in range(4):
        tap, add = (s.index for s in plan.steps if s.name in (f"layers.{i}.tap", f"layers.{i}.add"))
        edge = rerouted[f"layers.{i}.res"]
        assert (edge.src, edge.dst) == (f"s{tap}", f"s{add}")
        assert edge.label == f"layers.{i}.res (rerouted: fuser {i} -> {i + 1} across layers.{i}.act (Tanh))"
    mermaid = to_mermaid(view)
    links = [view.edges.index(e) for e in rerouted.values()]
    assert f"linkStyle {','.join(map(str, sorted(links)))} stroke:#9467bd" in mermaid
    assert to_dot(view).count('color="#9467bd", fontcolor="#9467bd"') == 5
    # One use expanded: its steps drawn, the others two collapsed nodes.
    expand, _ = parse_expand(["layers.2"], plan.blocks, "graph.expand")
    view = view_from_plan(plan, expand)
    assert [n.label.split("\n")[0] for n in view.nodes_of("block")] == ["layers[0-1]", "layers[3]"]
    assert {e.label.split(" ")[0] for e in view.edges if e.kind == "rerouted"} == {"skip", "layers.2.res"}


def test_graph_of_a_broken_block_marks_the_collapsed_node(tmp_path: Path) -> None:
    loaded = load(str(_write(tmp_path, REPEAT.replace("addend: res}", "addend: rez}"))))
    assert loaded.plan is None
    view = view_from_analysis(loaded)
    [block] = view.nodes_of("block")
    assert block.error is not None and "rez" in block.error
    [missing] = view.nodes_of("missing")  # one for the four uses
    assert missing.label == "missing channel 'layers[0-3].rez'"
    assert [(e.src, e.dst) for e in view.edges if e.kind == "error"] == [(missing.id, block.id)]


def test_cli_explain_and_graph_expand(run_cli: RunCli, tmp_path: Path) -> None:
    model = _write(tmp_path, REPEAT)
    done = run_cli(["explain", f"model={model}", "explain.expand=[layers.1]"])
    assert done.returncode == 0, done.stderr
    assert "layers.1.down" in done.stdout and "layers.0.down" not in done.stdout
    assert "layers[0]" in done.stdout and "layers[2-3]" in done.stdout
    assert "rerouted fuser 1 -> 2 across layers.1.act (Tanh)" in done.stdout
    done = run_cli(["explain", f"model={model}", "explain.expand=[layer]"])
    assert done.returncode == 2
    assert "explain.expand" in done.stderr and "did you mean 'layers'" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    out = tmp_path / "drawn"
    done = run_cli(
        [
            "graph",
            f"model={model}",
            f"graph.out_dir={out}",
            "graph.formats=[mermaid,dot]",
            "graph.expand=[layers.9]",
        ]
    )
    assert done.returncode == 2 and "layers has 4 use(s), numbered 0-3" in done.stderr
    assert "Traceback" not in done.stderr and not out.exists()
    done = run_cli(["graph", f"model={model}", f"graph.out_dir={out}", "graph.formats=[mermaid,dot]"])
    assert done.returncode == 0, done.stderr
    assert "layers[0-3]<br/>block layer x 4" in done.stdout
    assert (
        "rerouted in each use: res: fuser +0 -#gt; +1 across act (Tanh)" in (out / "blocky.mmd").read_text()
    )
    assert (
        'label="skip (rerouted: fuser 0 -&gt; 4 across layers[0-3].act (Tanh))"'
        in (out / "blocky.dot").read_text()
    )


@pytest.mark.parametrize("section", ["explain", "graph"])
def test_expand_of_a_model_without_blocks(run_cli: RunCli, section: str, tmp_path: Path) -> None:
    done = run_cli(
        [section, "model=residual_mlp", f"{section}.expand=[layers]", f"graph.out_dir={tmp_path / 'g'}"]
    )
    assert done.returncode == 2
    assert f"{section}.expand" in done.stderr and "uses no blocks" in done.stderr
    assert "Traceback" not in done.stderr


def test_validate_checks_expand_names_against_the_model(run_cli: RunCli, tmp_path: Path) -> None:
    model = _write(tmp_path, REPEAT)
    done = run_cli(["validate", f"model={model}", "explain.expand=[layers.3]", "graph.expand=[all]"])
    assert done.returncode == 0, done.stderr
    done = run_cli(["validate", f"model={model}", "explain.expand=[layrs]", "graph.expand=[layers.4]"])
    assert done.returncode == 2
    assert "explain.expand: 'layrs' is no block step" in done.stderr
    assert "did you mean 'layers'" in done.stderr
    assert "graph.expand: layers has 4 use(s)" in done.stderr
    assert "Traceback" not in done.stderr
