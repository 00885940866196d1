"""``model.summary()`` (the ``explain`` tables as text) and ``model.plot(path)`` (the ``graph`` picture)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import te_assembly.views.graph as graph_module
from te_assembly.analysis import analyze_resolved
from te_assembly.analysis.plan import Plan
from te_assembly.config import configs_dir
from te_assembly.config.resolved import resolve_text
from te_assembly.engines import build
from te_assembly.engines.base import AssembledModel
from te_assembly.engines.target import Target
from te_assembly.errors import ArgumentError, MissingToolError
from te_assembly.views.model import Summary
from tests.engines._helpers import build_yaml, plan_from_yaml

RunCli = Callable[..., subprocess.CompletedProcess[str]]

# Channel and step names no shipped config uses, so a summary or picture of some other model fails.
OWN = """
name: own_model
in_features: 6
ops:
  - {name: keep_me, op: MakeExtraOutput, extra_outputs: {out: {channel: zz_saved, public: false}}}
  - {name: widen, op: Linear, args: {in_features: 6, out_features: 10}}
  - {name: squash, op: Linear, args: {in_features: 10, out_features: 6}}
  - {name: add_back, op: AddExtraInput, extra_inputs: {addend: zz_saved}}
  - {name: cut_here, module: Identity}
  - {name: tap_two, op: MakeExtraOutput, extra_outputs: {out: {channel: qq_public}}}
"""


def _shipped(name: str) -> Plan:
    return analyze_resolved(
        resolve_text((configs_dir() / "model" / f"{name}.yaml").read_text())
    ).checked_plan()


def _check_names(text: str, plan: Plan) -> None:
    for step in plan.steps:
        assert step.name in text, step.name
    for channel in plan.channels:
        assert channel in text, channel


@pytest.mark.parametrize("model", ["moe_block", "residual_mlp"])
def test_summary_is_explains_output(run_cli: RunCli, model: str) -> None:
    done = run_cli(["explain", f"model={model}"])  # COLUMNS=400 in run_cli
    assert done.returncode == 0, done.stderr
    torch.manual_seed(0)
    plan = _shipped(model)
    built = build(plan, "reference")
    text = built.summary(width=400)
    assert isinstance(text, Summary) and isinstance(text, str)
    assert text == done.stdout
    _check_names(text, plan)
    # repr shows the tables themselves at a Python prompt, not an escaped one-line string.
    assert repr(text) == str(text) and "\n" in repr(text)


def test_summary_of_a_users_model_lists_its_steps_fusers_and_channels() -> None:
    model = build_yaml(OWN)
    plan = model.plan
    text = model.summary(width=200)
    _check_names(text, plan)
    # The module step ends fuser 0; the ops after it are in fuser 1, and both show in the steps table.
    assert re.search(r"│ 4 │ cut_here\s+│ Identity\s+│ -\s+│ \(module", text)
    assert re.search(r"│ 5 │ tap_two\s+│ MakeExtraOutput\s+│ 1\s+│", text)
    assert re.search(r"│ zz_saved\s+│ \S+\s+│ keep_me\.out\s+│ add_back\.addend\s+│ internal", text)
    assert "qq_public" in text and "public" in text
    total = sum(p.numel() for p in model.parameters())
    assert re.search(rf"│\s+│ total\s+│.*│\s+{total:,} │", text)
    # Narrower width, same content: the summary follows the width it is given.
    narrow = model.summary(width=60)
    assert max(len(line) for line in narrow.splitlines()) <= 60 < max(len(line) for line in text.splitlines())


@pytest.mark.parametrize("suffix", ["mmd", "dot"])
def test_plot_writes_the_graph_naming_every_channel(tmp_path: Path, suffix: str) -> None:
    model = build_yaml(OWN)
    target = tmp_path / "pics" / f"own.{suffix}"  # the folder is created
    assert model.plot(target) == target
    text = target.read_text()
    _check_names(text, model.plan)
    assert text.startswith("flowchart" if suffix == "mmd" else "digraph")
    # Same text as the graph module draws for the plan: one drawing code path.
    expected = (graph_module.to_mermaid if suffix == "mmd" else graph_module.to_dot)(
        graph_module.view_from_plan(model.plan)
    )
    assert text == expected


def test_plot_accepts_a_string_path(tmp_path: Path) -> None:
    model = build_yaml(OWN)
    out = model.plot(str(tmp_path / "g.mmd"))
    assert out == tmp_path / "g.mmd" and "zz_saved" in out.read_text()


@pytest.mark.parametrize("suffix", ["svg", "png"])
def test_plot_without_graphviz_raises_the_typed_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    monkeypatch.setattr(graph_module, "dot_binary", lambda: None)
    model = build_yaml(OWN)
    with pytest.raises(MissingToolError, match="Graphviz"):
        model.plot(tmp_path / f"g.{suffix}")
    assert not (tmp_path / f"g.{suffix}").exists()


def test_plot_with_an_unknown_suffix_names_the_known_ones(tmp_path: Path) -> None:
    model = build_yaml(OWN)
    with pytest.raises(ArgumentError, match=r"\.mmd.*\.dot.*\.svg.*\.png"):
        model.plot(tmp_path / "g.jpeg")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.te
def test_te_model_summary_and_plot_match_the_reference(tmp_path: Path) -> None:
    plan = plan_from_yaml(OWN)
    torch.manual_seed(0)
    te_model = build(plan, Target.of("te", device="cpu", kernels="reference"))
    ref_model = build(plan, "reference")
    assert isinstance(te_model, AssembledModel) and type(te_model) is not type(ref_model)
    te_text, ref_text = te_model.summary(width=200), ref_model.summary(width=200)
    cut = "TE fusions (for cpu"  # the plan's tables are the same; the fusions are each model's own
    assert te_text[: te_text.index(cut)] == ref_text[: ref_text.index(cut)]
    assert "kernels=reference" in te_text[te_text.index(cut) :] and "none fire" in te_text
    assert "kernels=te" in ref_text[ref_text.index(cut) :]
    te_model.plot(tmp_path / "te.dot")
    ref_model.plot(tmp_path / "ref.dot")
    assert (tmp_path / "te.dot").read_text() == (tmp_path / "ref.dot").read_text()


BLOCKS_MODEL = {
    "name": "repeated",
    "in_features": 8,
    "blocks": {
        "layer": {
            "ops": [
                {"name": "fc", "op": "Linear", "args": {"in_features": 8, "out_features": 8}},
                {"name": "act", "op": "GELU"},
            ]
        }
    },
    "ops": [{"name": "layers", "block": "layer", "repeat": 3}],
}


def test_summary_and_plot_collapse_blocks_unless_expanded(tmp_path: Path) -> None:
    model = build(BLOCKS_MODEL, "reference")
    collapsed = str(model.summary(width=200))
    assert "layers[0-2]" in collapsed and "layers.1.fc" not in collapsed
    expanded = str(model.summary(width=200, expand=["all"]))
    assert all(f"layers.{i}.fc" in expanded for i in range(3))
    one = str(model.summary(width=200, expand="layers.1"))
    assert "layers.1.fc" in one and "layers.0.fc" not in one
    with pytest.raises(ArgumentError, match="layer"):
        model.summary(expand=["layres"])
    drawn = model.plot(tmp_path / "all.mmd", expand=["all"]).read_text()
    assert all(f"layers.{i}.fc" in drawn for i in range(3))
    assert "layers.2.fc" not in model.plot(tmp_path / "collapsed.mmd").read_text()
