"""The model API of the reference engine: calls by name and position, call errors, parameter names."""

from __future__ import annotations

import pytest
import torch

from te_assembly.catalog import MODULE_ALLOWLIST, OPS, load_object
from te_assembly.config import available_models
from te_assembly.engines import build
from te_assembly.engines.base import CallError
from te_assembly.engines.reference.model import ReferenceModel
from te_assembly.engines.target import Target
from tests.engines._helpers import F64, build_yaml, plan_from_yaml, randomize

TWO_INPUTS = """
name: two_inputs
in_features: 4
ops:
  - name: fc
    op: Linear
    args: {in_features: 4, out_features: 6}
  - name: shift
    op: AddExtraInput
  - name: norm
    module: LayerNorm
    args: {normalized_shape: 6}
  - name: proj
    module: Linear
    args: {in_features: 6, out_features: 4, bias: false}
  - name: tap
    op: MakeExtraOutput
  - name: scale
    op: ScaledSwiGLU
"""


def _model() -> ReferenceModel:
    model = build_yaml(TWO_INPUTS)
    randomize(model)
    return model


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return (
        torch.randn(3, 4, generator=gen, dtype=F64),
        torch.randn(3, 6, generator=gen, dtype=F64),
        torch.rand(3, generator=gen, dtype=F64),
    )


def test_named_call_equals_positional_call() -> None:
    model = _model()
    assert model.input_names == ["shift_addend", "scale_scales"]
    assert model.output_names == ["tap_out"]
    x, shift, scales = _inputs()
    by_name = model(x, scale_scales=scales, shift_addend=shift)
    by_position = model(x, shift, scales)
    raw = model.forward_positional(x, shift, scales)
    assert isinstance(raw, tuple) and len(raw) == 2
    assert list(by_name.extras) == ["tap_out"]
    calls = ((by_name.y, by_name.extras["tap_out"]), (by_position.y, by_position.extras["tap_out"]), raw)
    for y, tap in calls:
        torch.testing.assert_close(y, raw[0], rtol=0, atol=0)
        torch.testing.assert_close(tap, raw[1], rtol=0, atol=0)
    # Independent check of the math: SwiGLU(tap) * scales with tap = proj(LayerNorm(fc(x) + shift)).
    a, b = raw[1].chunk(2, dim=-1)
    torch.testing.assert_close(raw[0], torch.nn.functional.silu(a) * b * scales[:, None])
    fc = model.steps["fc"]
    hidden = x @ fc.basic_ops[0].weight.T + fc.basic_ops[1].bias + shift
    norm = model.steps["norm"]
    normed = torch.nn.functional.layer_norm(hidden, (6,), norm.weight, norm.bias, norm.eps)
    torch.testing.assert_close(raw[1], normed @ model.steps["proj"].weight.T)


def test_unknown_input_name_suggests_the_right_one() -> None:
    model = _model()
    x, shift, scales = _inputs()
    with pytest.raises(CallError, match=r"no public input 'shift_adend'.*did you mean 'shift_addend'"):
        model(x, shift_adend=shift, scale_scales=scales)


def test_missing_and_surplus_inputs_are_call_errors() -> None:
    model = _model()
    x, shift, scales = _inputs()
    with pytest.raises(CallError, match=r"missing public input.*scale_scales"):
        model(x, shift_addend=shift)
    with pytest.raises(CallError, match="given twice"):
        model(x, shift, shift_addend=shift, scale_scales=scales)
    with pytest.raises(CallError, match="takes 2 public extra input"):
        model(x, shift, scales, scales)
    with pytest.raises(CallError, match="takes 2 public extra input"):
        model.forward_positional(x, shift)
    with pytest.raises(CallError, match="takes 2 public extra input"):
        model.forward_positional(x, shift, scales, scales)
    assert isinstance(CallError("x"), TypeError)


@pytest.mark.parametrize("name", available_models())
def test_state_dict_names_and_shapes_follow_the_catalog(name: str) -> None:
    torch.manual_seed(0)
    model = build(name, Target.of("reference", dtype=torch.bfloat16))
    expected = {
        f"steps.{step.name}.{param}": shape
        for step in model.plan.steps
        for param, shape in step.param_shapes.items()
        if f"steps.{step.name}.{param}" not in model.plan.tied_params  # stored once, as what it is tied to
    }
    state = model.state_dict()
    assert {k: tuple(v.shape) for k, v in state.items()} == expected
    assert all(v.dtype == torch.bfloat16 for v in state.values())
    # the parameters: a buffer in the state dict (a router's expert_bias) is saved but never trained
    assert sum(p.numel() for p in model.parameters()) == model.plan.num_params


@pytest.mark.parametrize("name", available_models())
def test_parameters_come_in_the_plan_order(name: str) -> None:
    """A single process's optimizer order (``named_parameters``) is the plan's order of its parameters:
    what an expert-parallel checkpoint keys optimizer state by (``ParallelContext.optimizer_index``)."""
    model = build(name, "reference")
    params = [n for n, _ in model.named_parameters()]
    in_plan = [f"steps.{step.name}.{param}" for step in model.plan.steps for param in step.param_shapes]
    assert params == [key for key in in_plan if key in set(params)]


def test_module_steps_come_from_the_allowlist() -> None:
    model = _model()
    for step in model.plan.steps:
        module = type(model.steps[step.name])
        if step.kind == "module":
            assert module is load_object(MODULE_ALLOWLIST[step.type].torch_class)
        else:
            assert module is load_object(OPS[step.type].reference)


def test_build_is_deterministic_under_a_seed() -> None:
    plan = plan_from_yaml(TWO_INPUTS)
    states = []
    for _ in range(2):
        torch.manual_seed(11)
        states.append(build(plan, "reference").state_dict())
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    torch.manual_seed(12)
    other = build(plan, "reference").state_dict()
    assert not torch.equal(other["steps.fc.basic_ops.0.weight"], states[0]["steps.fc.basic_ops.0.weight"])


def test_state_dict_round_trips_between_builds() -> None:
    source = _model()
    target = build(source.plan, Target.of("reference", dtype=F64))
    target.load_state_dict(source.state_dict())
    x, shift, scales = _inputs()
    torch.testing.assert_close(target(x, shift, scales).y, source(x, shift, scales).y, rtol=0, atol=0)


def test_step_names_that_shadow_module_attributes() -> None:
    # ``half`` and ``train`` are nn.Module methods; ModuleDict refuses them, the engine must not.
    model = build_yaml(
        """
        name: shadow
        in_features: 4
        ops:
          - name: half
            op: ConstantScale
            args: {scale: 0.5}
          - name: train
            op: Bias
            args: {size: 4}
        """
    )
    assert list(model.state_dict()) == ["steps.train.bias"]
    assert isinstance(model.steps["half"], torch.nn.Module)
    x = torch.randn(2, 4, dtype=F64)
    torch.testing.assert_close(model(x).y, 0.5 * x + model.steps["train"].bias)


def test_bfloat16_close_to_float64() -> None:
    model64 = _model()
    model16 = build(model64.plan, Target.of("reference", dtype=torch.bfloat16))
    model16.load_state_dict(model64.state_dict())
    x, shift, scales = _inputs()
    y16 = model16(x.bfloat16(), shift.bfloat16(), scales.bfloat16()).y
    assert y16.dtype == torch.bfloat16
    torch.testing.assert_close(y16.double(), model64(x, shift, scales).y, rtol=5e-2, atol=5e-2)


@pytest.mark.gpu  # tests/conftest.py skips it without a GPU, or fails it under TE_ASSEMBLY_REQUIRE_GPU=1
def test_cuda_matches_cpu() -> None:
    cpu = _model()
    gpu = build(cpu.plan, Target.of("reference", device="cuda", dtype=F64))
    gpu.load_state_dict(cpu.state_dict())
    assert all(p.device.type == "cuda" for p in gpu.parameters())
    x, shift, scales = _inputs()
    y_gpu = gpu(x.cuda(), shift.cuda(), scales.cuda()).y
    y_gpu.square().sum().backward()
    cpu(x, shift, scales).y.square().sum().backward()
    torch.testing.assert_close(y_gpu.cpu(), cpu(x, shift, scales).y)
    for (name, p_cpu), p_gpu in zip(cpu.named_parameters(), gpu.parameters(), strict=True):
        assert p_cpu.grad is not None and p_gpu.grad is not None, name
        torch.testing.assert_close(p_gpu.grad.cpu(), p_cpu.grad)


ROWWISE = """
name: rowwise
in_features: 4
ops:
  - name: fc
    op: Linear
    args: {in_features: 4, out_features: 4}
  - name: tap
    op: MakeExtraOutput
  - name: act
    module: GELU
  - name: bias
    op: Bias
    args: {size: 4}
"""


def test_moe_model_rejects_x_that_is_not_2d_with_a_reshape_hint() -> None:
    torch.manual_seed(0)
    model = build("moe_block", Target.of("reference", dtype=F64))
    x = torch.randn(2, 3, 64, dtype=F64)
    for call in (model, model.forward_positional):
        with pytest.raises(CallError, match=r"\[tokens, features\].*\(2, 3, 64\).*x\.reshape\(-1, 64\)"):
            call(x)
    y, extras = model(x.reshape(-1, 64))
    assert y.shape == (6, 64) and set(extras) == {"aux_loss"}


def test_x_is_checked_once_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = build("moe_block", Target.of("reference", dtype=F64))
    calls: list[tuple[int, ...]] = []
    check = model._check

    def counting(x: torch.Tensor, inputs: tuple[torch.Tensor, ...]) -> None:
        calls.append(tuple(x.shape))
        check(x, inputs)

    monkeypatch.setattr(model, "_check", counting)
    x = torch.randn(6, 64, dtype=F64)
    model(x)
    assert calls == [(6, 64)]
    calls.clear()
    model.forward_positional(x)
    assert calls == [(6, 64)]


def test_row_preserving_model_accepts_leading_dims() -> None:
    model = build_yaml(ROWWISE)
    randomize(model)
    x = torch.randn(2, 3, 4, dtype=F64)
    y, extras = model(x)
    flat_y, flat_extras = model(x.reshape(-1, 4))
    assert y.shape == (2, 3, 4)
    torch.testing.assert_close(y.reshape(-1, 4), flat_y)
    torch.testing.assert_close(extras["tap_out"].reshape(-1, 4), flat_extras["tap_out"])
