"""Choosing the engine: a typo is a config error with a suggestion (exit 2), not a runtime failure."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from te_assembly.engines import resolve_engine
from te_assembly.errors import ConfigError


def test_unknown_engine_and_kernels_are_reported_together() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_engine("refrence", "referenc")
    found = {(d.path, d.hint) for d in info.value.diagnostics}
    assert found == {("engine", "did you mean 'reference'?"), ("kernels", "did you mean 'reference'?")}


def test_auto_names_what_is_missing() -> None:
    engine, reason = resolve_engine("auto")
    assert engine in ("reference", "te")
    if engine == "reference":
        assert reason.startswith("engine=reference: no ") and "reference engine" in reason


def test_cli_engine_typo_exits_2(run_cli: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    done = run_cli(["engine=tee", "run.steps=1"])
    assert done.returncode == 2
    assert "engine: engine must be one of auto, reference, te, got 'tee'" in done.stderr
    assert "did you mean 'te'?" in done.stderr
    assert "Traceback" not in done.stderr
