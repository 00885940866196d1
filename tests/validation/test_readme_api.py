"""The Python API guide's first snippet (docs/guides/python-api.md) runs as written, from a directory
outside the repository, and does what its comments say."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import te_assembly
from te_assembly.analysis.pipeline import load
from te_assembly.config import configs_dir
from tests.docs_text import block_after

REPO_ROOT = Path(__file__).resolve().parents[2]


def _snippet() -> str:
    return block_after("guides/python-api.md", "# The Python API")


def test_readme_python_api_snippet_runs_from_another_directory(
    monkeypatch: pytest.MonkeyPatch, capsys: Any, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # a user's own directory: no configs/ next to it
    namespace: dict[str, Any] = {}
    exec(compile(_snippet(), "python-api.md", "exec"), namespace)
    x, y, extras = namespace["x"], namespace["y"], namespace["extras"]
    assert y.shape == x.shape
    assert set(extras) == {"aux_loss"} and extras["aux_loss"].dim() == 0
    assert torch.equal(namespace["y_te"], y) and torch.equal(namespace["aux_loss"], extras["aux_loss"])
    grads = [p.grad for p in namespace["model"].parameters()]
    assert grads and all(g is not None for g in grads)
    plan = namespace["analysis"].plan
    assert plan.in_features == 32
    assert namespace["small"].plan is plan
    assert sum(p.numel() for p in namespace["small"].parameters()) == plan.num_params
    printed = capsys.readouterr().out
    assert f"32 {plan.num_params}" in printed
    assert "in_features=32 but the main path arrives with width 64" in printed
    assert "set in_features: 64" in printed


def test_shipped_config_is_found_from_any_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    path = te_assembly.shipped_config("model/residual_mlp.yaml")
    assert path.is_absolute() and path.parent.parent == te_assembly.configs_dir()
    assert te_assembly.shipped_config("recipe/mxfp8.yaml").name == "mxfp8.yaml"
    with pytest.raises(FileNotFoundError, match=r"no shipped config 'model/nope\.yaml'"):
        te_assembly.shipped_config("model/nope.yaml")


def test_build_accepts_a_raw_model_mapping() -> None:
    raw = yaml.safe_load((configs_dir() / "model" / "residual_mlp.yaml").read_text())
    plan = load(raw).checked_plan()
    assert plan.in_features == 64 and plan.step("fc1").args["out_features"] == 256
    assert load({"model": raw}).checked_plan().step("fc1").args == plan.step("fc1").args
    model = te_assembly.build(raw, "reference")
    assert model.plan.step("fc1").args == plan.step("fc1").args


@pytest.mark.parametrize("bad", [None, 3, "moe_block", ["ops"]])
def test_validate_model_takes_only_a_mapping(bad: object) -> None:
    from te_assembly.errors import ArgumentError

    with pytest.raises(ArgumentError, match="validate_model\\(\\) takes a model mapping"):
        te_assembly.validate_model(bad)  # type: ignore[arg-type]
