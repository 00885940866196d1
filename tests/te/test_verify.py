"""``verify``'s comparison rules (no TE needed) and the command end to end (te tier)."""

from __future__ import annotations

from collections.abc import Callable
from subprocess import CompletedProcess

import pytest
import torch

from te_assembly.verify import TOLERANCES, Tolerance, compare, precision_class

TOL = Tolerance(atol=1e-6, rtol=1e-3)


def test_error_is_measured_against_the_tensors_scale() -> None:
    ref = torch.tensor([100.0, 0.0, -1.0])
    ok = compare("t", "output", ref + torch.tensor([0.05, 0.05, 0.0]), ref, TOL)  # 0.05 <= 1e-6 + 0.1
    bad = compare("t", "output", ref + torch.tensor([0.0, 0.2, 0.0]), ref, TOL)
    assert ok.passed and not bad.passed
    assert bad.max_abs == pytest.approx(0.2) and bad.max_rel == pytest.approx(0.002)


def test_nan_shape_and_integer_mismatches_fail() -> None:
    ref = torch.ones(3)
    assert not compare("t", "output", torch.tensor([1.0, float("nan"), 1.0]), ref, TOL).passed
    shape = compare("t", "output", torch.ones(4), ref, TOL)
    assert not shape.passed and "shape" in shape.note
    ints = torch.tensor([1, 2, 3])
    assert compare("m", "output", ints.clone(), ints, TOL).exact
    assert not compare("m", "output", torch.tensor([1, 2, 4]), ints, Tolerance(10.0, 10.0)).passed


def test_missing_gradient_counts_as_zero() -> None:
    assert compare("g", "param grad", None, torch.zeros(2), TOL).passed
    assert not compare("g", "param grad", None, torch.ones(2), TOL).passed
    assert compare("g", "param grad", None, None, TOL).passed


def test_tolerance_class_follows_recipe_then_dtype() -> None:
    assert precision_class(torch.bfloat16, {"kind": "none"}) == "bfloat16"
    assert precision_class(torch.bfloat16, {"kind": "MXFP8BlockScaling"}) == "fp8"
    assert precision_class(torch.bfloat16, {"kind": "NVFP4BlockScaling"}) == "fp4"
    assert precision_class(torch.float64) == "float64"
    ordered = [TOLERANCES[k].rtol for k in ("float64", "float32", "bfloat16", "fp8", "fp4")]
    assert ordered == sorted(ordered)


def test_verify_without_te_exits_1_with_install_hint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import te_assembly.cli.commands.verify as command
    from te_assembly.cli.main import main

    monkeypatch.setattr(command, "te_available", lambda: False)
    assert main(["verify", "model=two_stage"]) == 1
    err = capsys.readouterr().err
    assert "install_te_cpu.sh" in err and "Transformer Engine" in err


@pytest.mark.te
def test_verify_command_passes_and_prints_every_tensor(run_cli: Callable[..., CompletedProcess[str]]) -> None:
    result = run_cli(["verify", "model=two_stage", "run.tokens=16"])
    assert result.returncode == 0, result.stderr
    for row in ("y", "stage2_in", "grad x", "grad bias_in_addend", "grad steps.fc2.basic_ops.0.weight"):
        assert row in result.stdout
    assert "kernels=reference" in result.stdout and "verify passed: 8 tensors match" in result.stdout


@pytest.mark.te
def test_verify_command_exit_1_when_kernels_need_a_gpu(run_cli: Callable[..., CompletedProcess[str]]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: kernels=te runs")
    result = run_cli(["verify", "model=moe_block", "kernels=te"])
    assert result.returncode == 1
    assert "fc1 (GroupedLinear)" in result.stderr
