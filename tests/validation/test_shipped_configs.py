"""Every model shipped under configs/model/ validates with no errors, in the library and in the CLI."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from te_assembly.config import available_models, config_dir, load_model_file
from te_assembly.validate import analyze

RunCli = Callable[..., subprocess.CompletedProcess[str]]
MODEL_DIR = config_dir() / "model"
SHIPPED = sorted(MODEL_DIR.rglob("*.yaml"))


def _model_name(path: Path) -> str:
    return path.relative_to(MODEL_DIR).with_suffix("").as_posix()


def test_configs_are_discovered() -> None:
    # Guards the parametrization below: an empty glob would make every other test here vacuous.
    assert SHIPPED, f"no model configs under {MODEL_DIR}"
    assert {_model_name(p) for p in SHIPPED} >= set(available_models())


@pytest.mark.parametrize("path", SHIPPED, ids=_model_name)
def test_shipped_config_is_valid(path: Path, run_cli: RunCli) -> None:
    loaded = load_model_file(path)
    assert [d.format() for d in loaded.diagnostics] == []
    diags, plan = analyze(loaded.model)
    errors = [d.format() for d in diags if d.is_error]
    assert errors == []
    assert plan is not None
    assert plan.name == loaded.model["name"]
    assert len(plan.steps) == len(loaded.model["ops"])

    result = run_cli(["validate", f"model={_model_name(path)}"])
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert f"{plan.name} (" in result.stdout and "valid" in result.stdout
