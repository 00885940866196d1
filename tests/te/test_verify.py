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
    # float32 through TE's GEMMs on a GPU is TF32; on the reference kernels it stays float32.
    assert precision_class(torch.float32, {"kind": "none"}, te_gemms=True) == "tf32"
    assert precision_class(torch.float32, te_gemms=False) == "float32"
    assert precision_class(torch.bfloat16, te_gemms=True) == "bfloat16"
    assert precision_class(torch.float32, {"kind": "DelayedScaling"}, te_gemms=True) == "fp8"
    ordered = [TOLERANCES[k].rtol for k in ("float64", "float32", "tf32", "bfloat16", "fp8", "fp4")]
    assert ordered == sorted(ordered) and len(set(ordered)) == len(ordered)


def test_tf32_tolerance_admits_tf32_operands_and_rejects_coarser_ones() -> None:
    """A float32 GEMM whose operands are cut to TF32 (rounded or truncated, as tensor cores may do)
    passes the tf32 class and fails the float32 one; operands truncated to bfloat16's 7 bits fail it."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(256, 512, generator=gen)
    b = torch.randn(512, 128, generator=gen)

    def cut(t: torch.Tensor, bits: int, truncate: bool) -> torch.Tensor:  # keep `bits` mantissa bits
        drop = 23 - bits
        half = 0 if truncate else 1 << (drop - 1)
        return ((t.view(torch.int32) + half) & ~((1 << drop) - 1)).view(torch.float32)

    exact = a.double() @ b.double()
    for truncate in (False, True):
        tf32 = (cut(a, 10, truncate).double() @ cut(b, 10, truncate).double()).float()
        assert compare("y", "output", tf32, exact, TOLERANCES["tf32"]).passed
        assert not compare("y", "output", tf32, exact, TOLERANCES["float32"]).passed
    bf16 = (cut(a, 7, True).double() @ cut(b, 7, True).double()).float()
    assert not compare("y", "output", bf16, exact, TOLERANCES["tf32"]).passed


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


PUBLIC_THEN_BIAS = """
name: public_then_bias
in_features: 8
ops:
  - name: tap
    op: MakeExtraOutput
    extra_outputs:
      out: {channel: tapped, public: true}
  - name: bias
    op: Bias
    args: {size: 8}
  - name: scale
    op: ConstantScale
    args: {scale: 0.5}
"""

WITH_DROPOUT = """
name: with_dropout
in_features: 8
ops:
  - name: fc
    op: Linear
    args: {in_features: 8, out_features: 8}
  - name: drop_op
    op: Dropout
    args: {p: 0.5}
  - name: drop_module
    module: Dropout
    args: {p: 0.3}
  - name: bias
    op: Bias
    args: {size: 8}
"""


def _plant_wrong_main_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """The TE engine returns its main output scaled by 1.5; public extra outputs stay right."""
    from te_assembly.engines.base import ModelOutput
    from te_assembly.engines.te.model import TEModel

    original = TEModel.forward

    def wrong(self: TEModel, x: torch.Tensor, *extra: torch.Tensor, **named: torch.Tensor) -> ModelOutput:
        out = original(self, x, *extra, **named)
        return ModelOutput(out.y * 1.5, out.extras)

    monkeypatch.setattr(TEModel, "forward", wrong)


@pytest.mark.te
def test_wrong_main_output_fails_even_when_a_public_output_is_named_y(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dataclasses

    from te_assembly.verify import MAIN_OUTPUT, verify
    from tests.engines._helpers import plan_from_yaml

    plan = plan_from_yaml(PUBLIC_THEN_BIAS)
    assert verify(plan, kernels="reference", dtype=torch.float64, tokens=8).passed
    # A public output called ``y`` (the validator reserves the name; a plan built around it must still
    # not let the channel stand in for the main output).
    clash = plan_from_yaml(PUBLIC_THEN_BIAS)
    clash.public_outputs[0] = dataclasses.replace(clash.public_outputs[0], name=MAIN_OUTPUT)
    assert verify(clash, kernels="reference", dtype=torch.float64, tokens=8).passed
    _plant_wrong_main_output(monkeypatch)
    clash_report = verify(clash, kernels="reference", dtype=torch.float64, tokens=8)
    assert not clash_report.passed
    assert [c.kind for c in clash_report.comparisons if c.name == MAIN_OUTPUT] == ["main output", "output"]
    report = verify(plan, kernels="reference", dtype=torch.float64, tokens=8)
    assert [(c.name, c.kind) for c in report.failures][:1] == [(MAIN_OUTPUT, "main output")]


@pytest.mark.te
def test_dropout_models_are_compared_in_eval_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    from te_assembly.verify import verify
    from tests.engines._helpers import plan_from_yaml

    plan = plan_from_yaml(WITH_DROPOUT)
    report = verify(plan, kernels="reference", dtype=torch.float64, tokens=32)
    assert report.passed, report.failures
    _plant_wrong_main_output(monkeypatch)
    assert "y" in {c.name for c in verify(plan, kernels="reference", dtype=torch.float64, tokens=32).failures}
