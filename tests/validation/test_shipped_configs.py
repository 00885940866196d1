"""Every model shipped under configs/model/ validates with no errors, in the library and in the CLI."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from te_assembly.config import available_models, configs_dir
from te_assembly.config.resolved import read_source
from te_assembly.pipeline import load

RunCli = Callable[..., subprocess.CompletedProcess[str]]
MODEL_DIR = configs_dir() / "model"
SHIPPED = sorted(MODEL_DIR.rglob("*.yaml"))


def _model_name(path: Path) -> str:
    return path.relative_to(MODEL_DIR).with_suffix("").as_posix()


def test_configs_are_discovered() -> None:
    # Guards the parametrization below: an empty glob would make every other test here vacuous.
    assert SHIPPED, f"no model configs under {MODEL_DIR}"
    assert {_model_name(p) for p in SHIPPED} >= set(available_models())


@pytest.mark.parametrize("path", SHIPPED, ids=_model_name)
def test_shipped_config_is_valid(path: Path, run_cli: RunCli) -> None:
    source = read_source(str(path), "model")
    assert [d.format() for d in source.diagnostics] == []
    analysis = load(path)
    errors = [d.format() for d in analysis.errors]
    assert errors == []
    plan = analysis.plan
    assert plan is not None
    assert plan.name == source.data["name"]
    assert len(plan.steps) == len(source.data["ops"])

    result = run_cli(["validate", f"model={_model_name(path)}"])
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert f"{plan.name} (" in result.stdout and "valid" in result.stdout
