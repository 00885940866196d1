"""``verify``'s comparison rules (no TE needed) and the command end to end (te tier)."""

from __future__ import annotations

from collections.abc import Callable
from subprocess import CompletedProcess
from typing import Any

import pytest
import torch

from te_assembly.analysis.settings import RunSettings
from te_assembly.engines.target import Target
from te_assembly.jobs.verify import TOLERANCES, Tolerance, compare, precision_class

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
    same = compare("m", "output", ints.clone(), ints, TOL)
    assert same.exact and same.passed
    assert not compare("m", "output", torch.tensor([1, 2, 4]), ints, Tolerance(10.0, 10.0)).passed


def test_missing_gradient_counts_as_zero() -> None:
    assert compare("g", "param grad", None, torch.zeros(2), TOL).passed
    assert not compare("g", "param grad", None, torch.ones(2), TOL).passed
    missing_ref = compare("g", "param grad", torch.ones(2), None, TOL)  # only the TE engine has one
    assert not missing_ref.passed and missing_ref.shape == (2,) and missing_ref.max_abs == 1.0
    assert compare("g", "param grad", torch.zeros(2), None, TOL).passed
    neither = compare("g", "param grad", None, None, TOL)
    assert (neither.name, neither.kind, neither.shape, neither.max_abs, neither.max_rel, neither.passed) == (
        "g",
        "param grad",
        (),
        0.0,
        0.0,
        True,
    )
    assert neither.note == "no gradient in either engine"


def test_comparison_rows_carry_their_numbers() -> None:
    row = compare("t", "output", torch.tensor([0.5, -0.25]), torch.tensor([0.25, -0.25]), TOL)
    assert (row.name, row.kind, row.shape, row.max_abs, row.max_rel, row.passed, row.exact) == (
        "t",
        "output",
        (2,),
        0.25,
        1.0,  # measured against max|ref| = 0.25, below 1
        False,
        False,
    )
    mismatch = compare("t", "output", torch.ones(4), torch.ones(3), TOL)
    assert (mismatch.name, mismatch.kind, mismatch.shape, mismatch.passed) == ("t", "output", (3,), False)
    assert (
        mismatch.max_abs == mismatch.max_rel == float("inf")
        and mismatch.note == "shape (4,) vs reference (3,)"
    )


def test_all_zero_and_empty_references() -> None:
    zero = torch.zeros(3)
    assert compare("t", "output", zero, zero, TOL).max_rel == 0.0
    off = compare("t", "output", torch.full((3,), 1e-3), zero, TOL)
    assert off.max_rel == float("inf") and off.max_abs == pytest.approx(1e-3) and not off.passed
    empty = compare("t", "output", torch.zeros(0, 4), torch.zeros(0, 4), TOL)
    assert empty.passed and (empty.max_abs, empty.max_rel, empty.shape) == (0.0, 0.0, (0, 4))


def test_the_threshold_itself_passes() -> None:
    exact = Tolerance(atol=0.25, rtol=0.5)  # binary fractions: the sums below are exact
    ref = torch.tensor([1.0, -0.5])
    assert compare("t", "output", ref + torch.tensor([0.75, 0.0]), ref, exact).passed  # 0.75 == 0.25 + 0.5
    assert not compare("t", "output", ref + torch.tensor([0.875, 0.0]), ref, exact).passed


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


def test_float64_threshold_is_pinned() -> None:
    """verify's float64 check is what proves the TE engine computes the reference math; loosening it
    (say to 1e-1/1e-5) would let real mistakes through, so its numbers are pinned here."""
    assert TOLERANCES["float64"] == Tolerance(atol=1e-12, rtol=1e-10)
    assert precision_class(torch.float64, None) == "float64"
    assert precision_class(torch.float64, {"kind": "none"}) == "float64"


@pytest.mark.parametrize("scale", [1.0, 100.0])
def test_a_1e_6_relative_float64_difference_fails(scale: float) -> None:
    ref = torch.linspace(-scale, scale, 50, dtype=torch.float64)
    tolerance = TOLERANCES[precision_class(torch.float64)]
    assert not compare("t", "output", ref + 1e-6 * scale, ref, tolerance).passed
    assert not compare("t", "output", ref * (1 + 1e-6), ref, tolerance).passed
    assert compare("t", "output", ref + 1e-13 * scale, ref, tolerance).passed


Outputs = tuple[torch.Tensor, ...]


def _shift_y(shift: float) -> Callable[[Outputs], Outputs]:
    return lambda out: (out[0] + shift, *out[1:])


def _reference_as_te(monkeypatch: pytest.MonkeyPatch, alter: Callable[[Outputs], Outputs]) -> None:
    """verify's 'TE engine' becomes a second reference engine whose outputs ``(y, *public outputs)`` pass
    through ``alter``: verify's own plumbing (thresholds by dtype, what is compared) runs without TE."""
    import te_assembly.engines.target as target_module

    real_build = target_module.assemble  # every job builds through its Target

    def build(plan: Any, engine: str, **kwargs: Any) -> Any:
        model = real_build(plan, engine="reference", device=kwargs.get("device"), dtype=kwargs["dtype"])
        if engine == "te":
            forward = model._forward_positional  # the engine's own forward, under every call path

            def altered(x: torch.Tensor, *extra: torch.Tensor) -> Any:
                out = forward(x, *extra)
                changed = alter(out if isinstance(out, tuple) else (out,))
                return changed if isinstance(out, tuple) else changed[0]

            model._forward_positional = altered  # type: ignore[method-assign]
        return model

    monkeypatch.setattr(target_module, "assemble", build)


def test_verify_fails_on_a_1e_6_float64_difference_without_te(monkeypatch: pytest.MonkeyPatch) -> None:
    from te_assembly.jobs.verify import MAIN_OUTPUT, verify

    _reference_as_te(monkeypatch, _shift_y(0.0))
    same = verify("residual_mlp", Target.of("te", dtype=torch.float64), RunSettings(tokens=8))
    assert same.passed and same.precision == "float64" and same.tolerance == TOLERANCES["float64"]
    _reference_as_te(monkeypatch, _shift_y(1e-6))
    shifted = verify("residual_mlp", Target.of("te", dtype=torch.float64), RunSettings(tokens=8))
    assert [c.name for c in shifted.failures] == [MAIN_OUTPUT]
    assert shifted.failures[0].max_abs == pytest.approx(1e-6, rel=1e-3)


def test_verify_command_exits_1_on_a_1e_6_float64_difference(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import te_assembly.cli.commands.verify as command
    from te_assembly.cli.main import main

    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setattr(command, "te_available", lambda: True)
    _reference_as_te(monkeypatch, _shift_y(1e-6))
    assert main(["verify", "model=two_stage", "dtype=float64", "run.tokens=8"]) == 1
    out = capsys.readouterr().out
    assert "verify FAILED: 1 of" in out and "1e-12 + 1e-10 * max|ref|" in out


def test_verify_defaults_and_what_it_compares(monkeypatch: pytest.MonkeyPatch) -> None:
    from te_assembly.jobs.verify import verify

    _reference_as_te(monkeypatch, _shift_y(0.0))
    report = verify("two_stage")
    assert (report.kernels, report.tokens, report.seed, report.dtype, report.device) == (
        "te",
        64,
        0,
        "float32",
        "cpu",
    )
    assert report.recipe is None and report.precision == "float32" and report.passed
    rows = {(c.name, c.kind) for c in report.comparisons}
    assert {("y", "main output"), ("stage2_in", "output"), ("grad x", "input grad")} <= rows
    assert ("grad bias_in_addend", "input grad") in rows
    params = {c.name for c in report.comparisons if c.kind == "param grad"}
    assert params == {
        f"grad steps.{s}.basic_ops.{i}.{p}" for s in ("fc1", "fc2") for i, p in ((0, "weight"), (1, "bias"))
    }


def test_verify_passes_its_settings_to_both_engines_and_the_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """What verify hands each engine and the inputs, and how it names the run (recorded, without TE)."""
    import te_assembly.engines.target as target_module
    import te_assembly.jobs.verify as verify_module

    real_build = target_module.assemble  # every job builds through its Target
    calls: list[tuple[str, dict[str, Any]]] = []
    input_dtypes: list[torch.dtype] = []

    def build(plan: Any, engine: str, **kwargs: Any) -> Any:
        calls.append((engine, kwargs))
        model = real_build(plan, engine="reference", device=kwargs["device"], dtype=kwargs["dtype"])
        forward = model._forward_positional

        def recording(x: torch.Tensor, *extra: torch.Tensor) -> Any:
            input_dtypes.extend([x.dtype, *(t.dtype for t in extra)])
            return forward(x, *extra)

        model._forward_positional = recording  # type: ignore[method-assign]
        return model

    monkeypatch.setattr(target_module, "assemble", build)
    recipe = {"name": "fp8_delayed", "kind": "DelayedScaling"}
    report = verify_module.verify(
        "two_stage",
        Target.of("te", kernels="reference", dtype=torch.float64, recipe=recipe),
        RunSettings(tokens=8),
    )
    cpu = torch.device("cpu")
    same = {"kernels": "reference", "device": cpu, "dtype": torch.float64, "parallel": None}
    assert calls == [("te", {**same, "recipe": recipe}), ("reference", {**same, "recipe": None})]
    assert set(input_dtypes) == {torch.float64}  # x and the public input, in both engines
    assert (report.model, report.recipe, report.precision) == ("two_stage", "fp8_delayed", "fp8")
    assert report.tolerance == TOLERANCES["fp8"]
    unnamed = verify_module.verify(
        "two_stage",
        Target.of("te", kernels="reference", recipe={"kind": "DelayedScaling"}),
        RunSettings(tokens=8),
    )
    assert unnamed.recipe == "DelayedScaling"


def test_verify_follows_gradients_through_public_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A TE engine whose public output carries no gradient back (the value is right) must fail: the
    loss includes every float public output, each with its own cotangent."""
    from te_assembly.jobs.verify import verify

    _reference_as_te(monkeypatch, lambda out: (out[0], *(t.detach() for t in out[1:])))
    report = verify("two_stage", Target.of("te", dtype=torch.float64), RunSettings(tokens=8))
    failed = {c.name for c in report.failures}
    assert "grad x" in failed and "grad steps.fc1.basic_ops.0.weight" in failed
    assert not failed & {"y", "stage2_in"}


def _two_models(first: str, second: str) -> tuple[Any, Any]:
    from te_assembly.engines import build
    from tests.engines._helpers import plan_from_yaml

    return build(plan_from_yaml(first), "reference"), build(plan_from_yaml(second), "reference")


ONE_LINEAR = """
name: one
in_features: 4
ops:
  - {name: fc, op: Linear, args: {in_features: 4, out_features: 4}}
"""


@pytest.mark.parametrize(
    ("other", "only_target", "only_source"),
    [
        (
            ONE_LINEAR.replace("{in_features: 4,", "{bias: false, in_features: 4,"),
            "none",
            "['steps.fc.basic_ops.1.bias']",
        ),
        (ONE_LINEAR + "  - {name: b, op: Bias, args: {size: 4}}\n", "['steps.b.bias']", "none"),
        (
            ONE_LINEAR.replace("name: fc,", "name: fc2,"),
            "['steps.fc2.basic_ops.0.weight', 'steps.fc2.basic_ops.1.bias']",
            "['steps.fc.basic_ops.0.weight', 'steps.fc.basic_ops.1.bias']",
        ),
    ],
)
def test_copy_weights_refuses_names_that_do_not_match(other: str, only_target: str, only_source: str) -> None:
    from te_assembly.errors import VerificationError
    from te_assembly.jobs.verify import copy_weights

    source, target = _two_models(ONE_LINEAR, other)
    message = (
        "parameter names differ between the reference and reference engines: "
        f"only in reference: {only_target}; only in reference: {only_source}"
    )
    with pytest.raises(VerificationError) as info:
        copy_weights(source, target)
    assert str(info.value) == message


def test_copy_weights_copies_every_tensor() -> None:
    from te_assembly.jobs.verify import copy_weights

    source, target = _two_models(ONE_LINEAR, ONE_LINEAR)
    with torch.no_grad():
        for p in source.parameters():
            p.normal_()
    copy_weights(source, target)
    want = source.state_dict()
    assert all(torch.equal(v, want[k]) for k, v in target.state_dict().items())


def test_fill_constant_parameters_moves_zeros_and_ones_reproducibly() -> None:
    from te_assembly.jobs.verify import fill_constant_parameters

    first, second = _two_models(ONE_LINEAR, ONE_LINEAR)
    second.load_state_dict(first.state_dict())
    weight = first.state_dict()["steps.fc.basic_ops.0.weight"].clone()
    assert not first.state_dict()["steps.fc.basic_ops.1.bias"].any()  # TE's zero-initialised bias
    fill_constant_parameters(first, seed=3)
    torch.manual_seed(99)  # the fill comes from its own generator, not the global one
    fill_constant_parameters(second, seed=3)
    bias = first.state_dict()["steps.fc.basic_ops.1.bias"]
    assert bias.all() and 0.01 < bias.abs().max() < 0.5  # N(0, 0.1^2): small, every element set
    assert torch.equal(first.state_dict()["steps.fc.basic_ops.0.weight"], weight)  # untouched
    assert torch.equal(second.state_dict()["steps.fc.basic_ops.1.bias"], bias)


@pytest.mark.parametrize(("model", "suffix"), [("moe_transformer", "norm.weight"), ("residual_mlp", ".bias")])
def test_verify_fails_when_engines_differ_only_in_a_zero_or_one_parameter(
    monkeypatch: pytest.MonkeyPatch, model: str, suffix: str
) -> None:
    """A planted engine bug that leaves norm scales at one, or biases at zero, in the TE model: the
    fresh weights already hold those values, so only verify's perturbation of constant parameters makes
    the difference show."""
    import te_assembly.jobs.verify as verify_module

    _reference_as_te(monkeypatch, _shift_y(0.0))
    real_copy = verify_module.copy_weights

    def copy_then_reset(source: torch.nn.Module, target: torch.nn.Module) -> None:
        real_copy(source, target)
        with torch.no_grad():
            for name, value in target.state_dict().items():
                if name.endswith(suffix):
                    value.fill_(1.0 if suffix == "norm.weight" else 0.0)

    monkeypatch.setattr(verify_module, "copy_weights", copy_then_reset)
    report = verify_module.verify(
        model, Target.of("te", dtype=torch.float64), RunSettings(tokens=32, seq_len=16)
    )
    assert not report.passed


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

    from te_assembly.jobs.verify import MAIN_OUTPUT, verify
    from tests.engines._helpers import plan_from_yaml

    plan = plan_from_yaml(PUBLIC_THEN_BIAS)
    assert verify(
        plan, Target.of("te", kernels="reference", dtype=torch.float64), RunSettings(tokens=8)
    ).passed
    # A public output called ``y`` (the validator reserves the name; a plan built around it must still
    # not let the channel stand in for the main output).
    clash = plan_from_yaml(PUBLIC_THEN_BIAS)
    clash.public_outputs[0] = dataclasses.replace(clash.public_outputs[0], name=MAIN_OUTPUT)
    assert verify(
        clash, Target.of("te", kernels="reference", dtype=torch.float64), RunSettings(tokens=8)
    ).passed
    _plant_wrong_main_output(monkeypatch)
    clash_report = verify(
        clash, Target.of("te", kernels="reference", dtype=torch.float64), RunSettings(tokens=8)
    )
    assert not clash_report.passed
    assert [c.kind for c in clash_report.comparisons if c.name == MAIN_OUTPUT] == ["main output", "output"]
    report = verify(plan, Target.of("te", kernels="reference", dtype=torch.float64), RunSettings(tokens=8))
    assert [(c.name, c.kind) for c in report.failures][:1] == [(MAIN_OUTPUT, "main output")]


@pytest.mark.te
def test_dropout_models_are_compared_in_eval_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    from te_assembly.jobs.verify import verify
    from tests.engines._helpers import plan_from_yaml

    plan = plan_from_yaml(WITH_DROPOUT)
    report = verify(plan, Target.of("te", kernels="reference", dtype=torch.float64), RunSettings(tokens=32))
    assert report.passed, report.failures
    _plant_wrong_main_output(monkeypatch)
    assert "y" in {
        c.name
        for c in verify(
            plan, Target.of("te", kernels="reference", dtype=torch.float64), RunSettings(tokens=32)
        ).failures
    }


@pytest.mark.te
def test_te_engine_1e_6_off_fails_float64_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real TE engine (kernels=reference) with its main output 1e-6 off fails float64 verify."""
    from te_assembly.engines.te.model import TEModel
    from te_assembly.jobs.verify import MAIN_OUTPUT, verify
    from tests.engines._helpers import plan_from_yaml

    plan = plan_from_yaml(PUBLIC_THEN_BIAS)
    assert verify(
        plan, Target.of("te", kernels="reference", dtype=torch.float64), RunSettings(tokens=8)
    ).passed
    original = TEModel.forward

    def off(self: TEModel, x: torch.Tensor, *extra: torch.Tensor, **named: torch.Tensor) -> Any:
        out = original(self, x, *extra, **named)  # a ModelOutput (y, extras)
        return out._replace(y=out.y + 1e-6)

    monkeypatch.setattr(TEModel, "forward", off)
    report = verify(plan, Target.of("te", kernels="reference", dtype=torch.float64), RunSettings(tokens=8))
    assert [c.name for c in report.failures] == [MAIN_OUTPUT]
