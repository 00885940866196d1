"""The tier rules of tests/conftest.py, run in a child pytest: a ``gpu`` test fails instead of skipping
when TE is required but does not import (``TE_ASSEMBLY_REQUIRE_TE=1``), or when a GPU is required but
there is none (``TE_ASSEMBLY_REQUIRE_GPU=1``, set by scripts/gpu_check.sh); without those variables it
skips with the reason. TE is made unimportable by a planted ``transformer_engine`` package that raises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
GPU_TEST = "tests/engines/test_model_api.py::test_cuda_matches_cpu"
TE_TEST = "tests/te/test_verify.py::test_verify_command_passes_and_prints_every_tensor"


def _pytest(
    test: str, env: dict[str, str], broken_te: Path | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TE_ASSEMBLY_REQUIRE")}
    path = [str(broken_te) if broken_te else "", str(REPO_ROOT), base.get("PYTHONPATH", "")]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=-rfEs", test],
        cwd=REPO_ROOT,
        env={**base, **env, "PYTHONPATH": os.pathsep.join(p for p in path if p), "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _not_passed(stdout: str) -> bool:
    """The conftest fails a test from its setup fixture, which pytest counts as an error, not a skip."""
    return ("1 failed" in stdout or "1 error" in stdout) and "skipped" not in stdout


@pytest.fixture
def broken_te(tmp_path: Path) -> Path:
    package = tmp_path / "transformer_engine"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('planted: TE is broken here')\n")
    return tmp_path


def test_gpu_test_skips_when_te_is_missing_and_not_required(broken_te: Path) -> None:
    result = _pytest(GPU_TEST, {}, broken_te)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout and "planted: TE is broken here" in result.stdout


@pytest.mark.parametrize("variable", ["TE_ASSEMBLY_REQUIRE_TE", "TE_ASSEMBLY_REQUIRE_GPU"])
def test_gpu_test_fails_when_te_is_required_but_missing(broken_te: Path, variable: str) -> None:
    result = _pytest(GPU_TEST, {variable: "1"}, broken_te)
    assert result.returncode == 1 and _not_passed(result.stdout), result.stdout + result.stderr
    assert f"{variable}=1 but transformer_engine.pytorch does not import" in result.stdout


def test_te_test_fails_when_te_is_required_but_missing(broken_te: Path) -> None:
    result = _pytest(TE_TEST, {"TE_ASSEMBLY_REQUIRE_TE": "1"}, broken_te)
    assert result.returncode == 1 and _not_passed(result.stdout), result.stdout + result.stderr


def test_gpu_test_fails_without_a_gpu_when_one_is_required() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present here: the test would run, not fail")
    result = _pytest(GPU_TEST, {"TE_ASSEMBLY_REQUIRE_GPU": "1"})
    assert result.returncode == 1 and _not_passed(result.stdout), result.stdout + result.stderr
    # Whichever is missing here (TE in the plain tier, else the GPU), the message says what was required.
    assert "TE_ASSEMBLY_REQUIRE_GPU=1 but" in result.stdout
    plain = _pytest(GPU_TEST, {})
    assert plain.returncode == 0 and "1 skipped" in plain.stdout, plain.stdout + plain.stderr
