"""The README's "Python API" snippet runs as written, and does what its comments say."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from te_assembly.config import config_dir
from te_assembly.engines import to_plan

REPO_ROOT = Path(__file__).resolve().parents[2]


def _snippet() -> str:
    text = (REPO_ROOT / "README.md").read_text()
    section = text[text.index("## Python API") :]
    section = section[: section.index("\n## ", 1)]
    found = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert found, "no python block in the README's Python API section"
    return found.group(1)


def test_readme_python_api_snippet_runs(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.chdir(REPO_ROOT)  # the snippet opens configs/... as a user in a checkout would
    namespace: dict[str, Any] = {}
    exec(compile(_snippet(), "README.md", "exec"), namespace)
    x, y, extras = namespace["x"], namespace["y"], namespace["extras"]
    assert y.shape == x.shape
    assert set(extras) == {"aux_loss"} and extras["aux_loss"].dim() == 0
    assert torch.equal(namespace["y_te"], y) and torch.equal(namespace["aux_loss"], extras["aux_loss"])
    grads = [p.grad for p in namespace["model"].parameters()]
    assert grads and all(g is not None for g in grads)
    printed = capsys.readouterr().out
    assert "in_features=32 but the main path arrives with width 64" in printed
    assert "set in_features: 64" in printed


def test_build_accepts_a_raw_model_mapping() -> None:
    raw = yaml.safe_load((config_dir() / "model" / "residual_mlp.yaml").read_text())
    plan = to_plan(raw)
    assert plan.in_features == 64 and plan.step("fc1").args["out_features"] == 256
    assert to_plan({"model": raw}).step("fc1").args == plan.step("fc1").args
