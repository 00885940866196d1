"""Every model shipped under configs/model/ validates with no errors, in the library and in the CLI."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from te_assembly.analysis.pipeline import load
from te_assembly.config import available_models, configs_dir
from te_assembly.config.resolved import read_source

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
    # A block step becomes its uses' steps (the transformers' layers), each use all of the block's ops.
    block_steps = [op for op in source.data["ops"] if "block" in op]
    assert [g.position for g in plan.blocks] == [source.data["ops"].index(op) for op in block_steps]
    for group in plan.blocks:
        assert len({u.num_steps for u in group.uses}) == 1
        assert [u.first_step for u in group.uses] == [
            group.uses[0].first_step + k * group.uses[0].num_steps for k in range(len(group.uses))
        ]
    expanded = sum(u.num_steps for g in plan.blocks for u in g.uses)
    assert len(plan.steps) == len(source.data["ops"]) - len(block_steps) + expanded

    result = run_cli(["validate", f"model={_model_name(path)}"])
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert f"{plan.name} (" in result.stdout and "valid" in result.stdout
