"""The TE engine on CPU: fusers built and locked at build time, reference engine equivalence on every
shipped config, and TE's channel semantics in closed form through TE's own CPU kernels."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from te_assembly.analysis.pipeline import load
from te_assembly.analysis.plan import Plan
from te_assembly.analysis.settings import RunSettings
from te_assembly.config import available_models
from te_assembly.engines import build
from te_assembly.engines.base import CallError
from te_assembly.engines.target import Target
from te_assembly.engines.te.routing import rerouted_input_slots
from te_assembly.errors import EngineUnavailableError

pytestmark = pytest.mark.te

F64 = torch.float64
LOCKED = r"Cannot change extra tensor channels of \w+ because an OperationFuser has already captured"


def _basic_ops(module: torch.nn.Module) -> list[Any]:
    return list(module.basic_ops) if getattr(module, "is_fused_op", False) else [module]


def _shipped_builds() -> list[tuple[str, str]]:
    cases = [(name, "reference") for name in available_models()]
    return cases + [(name, "te") for name in available_models() if not _gpu_steps(name)]


def _gpu_steps(name: str) -> list[str]:
    from te_assembly.engines.te import gpu_only_steps

    return gpu_only_steps(load(name).checked_plan(), "te")


@pytest.mark.parametrize(("model", "kernels"), _shipped_builds())
def test_fusers_are_built_and_every_op_locked_at_build_time(model: str, kernels: str) -> None:
    from transformer_engine.pytorch.ops import BasicOperation
    from transformer_engine.pytorch.ops.fuser import OperationFuser

    plan = load(model).checked_plan()
    te_model = build(plan, Target.of("te", kernels=kernels, dtype=F64))
    assert te_model.engine == "te"
    assert len(te_model.fusers) == len(plan.fusers)
    assert all(isinstance(f, OperationFuser) for f in te_model.fusers)
    # A channel rerouted from an earlier fuser is an extra input of each fuser that reads it (unbound
    # there), and its producer's slot is returned by the producer's fuser.
    rerouted = rerouted_input_slots(plan)
    carried = {r.channel for r in plan.reroutes}
    for group, fuser in zip(plan.fusers, te_model.fusers, strict=True):
        reads = sum(
            1
            for i in group.steps
            for k in range(len(plan.steps_by_index[i].input_slots))
            if (i, k) in rerouted
        )
        assert fuser.num_extra_inputs == reads + sum(1 for t in plan.public_inputs if t.fuser == group.index)
    for step in plan.steps:
        if step.kind != "op":
            assert not isinstance(te_model.step_module(step.name), BasicOperation)
            continue
        ops = _basic_ops(te_model.step_module(step.name))
        assert len(ops) == len(step.basic_ops)
        # The bindings TE holds are the plan's, and nothing can change them any more.
        if len(ops) == 1:
            inputs = [None if (step.index, k) in rerouted else c for k, c in enumerate(step.input_channels)]
            to_caller = [
                p or c in carried for p, c in zip(step.output_public, step.output_channels, strict=True)
            ]
            assert ops[0]._extra_input_channels == inputs
            assert ops[0]._extra_output_channels == list(step.output_channels)
            assert ops[0]._extra_output_to_caller == to_caller
        for op in ops:
            if op.num_extra_inputs:
                with pytest.raises(RuntimeError, match=LOCKED):
                    op.set_extra_input_channel(0, "rebound")
            if op.num_extra_outputs:
                with pytest.raises(RuntimeError, match=LOCKED):
                    op.set_extra_output_channel(0, None)
            if not (op.num_extra_inputs or op.num_extra_outputs):
                with pytest.raises(IndexError):  # TE checks the index before the lock
                    op.set_extra_input_channel(0, "x")
            assert op._extra_tensor_channels_locked


@pytest.mark.parametrize("model", available_models())
def test_te_engine_matches_reference_engine_on_shipped_configs(model: str) -> None:
    from te_assembly.jobs.verify import verify

    plan = load(model).checked_plan()
    for dtype in (F64, torch.float32):
        report = verify(
            plan, Target.of("te", kernels="reference", dtype=dtype, seed=5), RunSettings(tokens=24, seq_len=8)
        )
        assert report.passed, report.failures
        names = {c.name for c in report.comparisons}
        reference = build(plan, "reference")
        assert {f"grad {n}" for n, _ in reference.named_parameters()} <= names
        inputs = [] if plan.takes_token_ids else ["grad x"]  # token ids have no gradient
        assert {"y", *inputs, *plan_output_names(plan)} <= names


def plan_output_names(plan: Plan) -> list[str]:
    return [t.name for t in plan.public_outputs]


def test_verify_catches_a_lost_channel_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drop the gradients TE routes back into our ops' extra outputs: verify must notice."""
    from te_assembly.engines.te.adapter import ReferenceAdapter
    from te_assembly.jobs.verify import verify

    original = ReferenceAdapter.fuser_backward

    def lossy(
        self: ReferenceAdapter, ctxs: Any, grad: torch.Tensor, *, basic_op_grad_extra_outputs: Any
    ) -> Any:
        dropped = [tuple(None for _ in g) for g in basic_op_grad_extra_outputs]
        return original(self, ctxs, grad, basic_op_grad_extra_outputs=dropped)

    monkeypatch.setattr(ReferenceAdapter, "fuser_backward", lossy)
    report = verify("moe_block", Target.of("te", kernels="reference", dtype=F64), RunSettings(tokens=16))
    failed = {c.name for c in report.failures}
    # probs reach Dispatch, aux_loss reaches the caller: both carry gradient to the router weight.
    assert "grad steps.router.weight" in failed
    assert "y" not in failed


def test_param_names_equal_te_ops_and_reference_engine() -> None:
    """kernels=reference exposes exactly the names (and shapes) TE's real ops would."""
    from te_assembly.catalog import OPS, load_object

    for name in available_models():
        plan = load(name).checked_plan()
        adapted = build(plan, Target.of("te", kernels="reference", dtype=torch.float32))
        reference = build(plan, Target.of("reference", dtype=torch.float32))
        assert _tensor_names(adapted) == _tensor_names(reference), name
        for step in plan.steps:
            spec = OPS.get(step.type) if step.kind == "op" else None
            if spec is None or spec.te_class is None:
                continue
            cls = load_object(spec.te_class)
            # As the builder does: tensor_parallel_mode only acts under parallel.tensor > 1 (TE would ask
            # for a process group).
            args = {k: v for k, v in step.args.items() if k not in spec.validation_only_params}
            try:
                te_op = cls(**args, device="cpu", dtype=torch.float32)
            except TypeError:  # TE ops without parameters take no device/dtype
                te_op = cls(**args)
            expected = {
                k: tuple(v.shape) for k, v in te_op.state_dict().items() if not k.endswith("_extra_state")
            }
            got = {
                k: tuple(v.shape)
                for k, v in adapted.step_module(step.name).state_dict().items()
                if not k.endswith("_extra_state")
            }
            assert got == expected, (name, step.name)


def _tensor_names(model: torch.nn.Module) -> list[str]:
    return sorted(k for k in model.state_dict() if not k.endswith("._extra_state"))


def test_kernels_te_on_cpu_fails_early_naming_gpu_steps() -> None:
    with pytest.raises(EngineUnavailableError, match=r"norm \(RMSNorm\), fc1 \(GroupedLinear\), act"):
        build("moe_block", Target.of("te", kernels="te"))


def test_quantization_recipe_needs_a_gpu_before_anything_runs() -> None:
    from te_assembly.analysis.recipes import load_recipe

    with pytest.raises(EngineUnavailableError, match="needs a CUDA GPU"):
        build("channel_demo", Target.of("te", kernels="te", recipe=load_recipe("fp8_current")))
    model = build("channel_demo", Target.of("te", kernels="te", recipe=load_recipe("bf16")))
    assert model.te_recipe is None


def test_wrong_number_of_public_inputs_is_rejected() -> None:
    model = build("two_stage", Target.of("te", kernels="reference", dtype=F64))
    x = torch.randn(4, 32, dtype=F64)
    with pytest.raises(CallError, match="takes 1 public extra input"):
        model.forward_positional(x)
    with pytest.raises(CallError, match="takes 1 public extra input"):
        # te.ops.Sequential would silently drop the surplus tensor
        model.forward_positional(x, torch.zeros(4, 32, dtype=F64), torch.zeros(4, 32, dtype=F64))


def test_moe_model_rejects_x_that_is_not_2d() -> None:
    model = build("moe_block", Target.of("te", kernels="reference", dtype=F64))
    x = torch.randn(2, 3, 64, dtype=F64)
    for call in (model, model.forward_positional):
        with pytest.raises(CallError, match=r"\[tokens, features\].*x\.reshape\(-1, 64\)"):
            call(x)
    assert model(x.reshape(-1, 64)).y.shape == (6, 64)


# ----------------------------------------------------------------------------------------------
# TE's channel scenarios, through TE's own CPU kernels, against closed forms.

H = 6


def _te_model(ops: list[dict[str, Any]]) -> Any:
    plan = load({"name": "scenario", "in_features": H, "ops": ops}).checked_plan()
    return build(plan, Target.of("te", kernels="te", dtype=F64))


TAP_HIDDEN = {
    "name": "tap",
    "op": "MakeExtraOutput",
    "extra_outputs": {"out": {"channel": "r", "public": False}},
}


def _x() -> torch.Tensor:
    return torch.randn(5, H, dtype=F64, generator=torch.Generator().manual_seed(0)).requires_grad_(True)


def test_internal_residual_doubles_x_and_its_gradient() -> None:
    model = _te_model(
        [
            TAP_HIDDEN,
            {"name": "b", "op": "Bias", "args": {"size": H}},
            {"name": "add", "op": "AddExtraInput", "extra_inputs": {"addend": "r"}},
        ]
    )
    bias = model.steps["b"].bias
    with torch.no_grad():
        bias.copy_(torch.arange(H, dtype=F64))
    x = _x()
    y, extras = model(x)
    assert extras == {}
    torch.testing.assert_close(y, 2 * x + bias)  # (x + b) + x rounds differently from 2x + b
    dy = torch.randn_like(y)
    y.backward(dy)
    torch.testing.assert_close(x.grad, 2 * dy, rtol=0, atol=0)
    torch.testing.assert_close(bias.grad, dy.sum(0))


def test_fan_out_channel_sums_every_consumer_gradient() -> None:
    add = {"op": "AddExtraInput", "extra_inputs": {"addend": "r"}}
    model = _te_model([TAP_HIDDEN, {"name": "a1", **add}, {"name": "a2", **add}])
    x = _x()
    y = model.forward_positional(x)
    torch.testing.assert_close(y, 3 * x, rtol=0, atol=0)
    dy = torch.randn_like(y)
    y.backward(dy)
    torch.testing.assert_close(x.grad, 3 * dy, rtol=0, atol=0)


def test_public_and_hidden_outputs() -> None:
    model = _te_model(
        [
            {
                "name": "tap",
                "op": "MakeExtraOutput",
                "extra_outputs": {"out": {"channel": "r", "public": True}},
            },
            {
                "name": "hidden",
                "op": "MakeExtraOutput",
                "extra_outputs": {"out": {"channel": "h", "public": False}},
            },
            {"name": "scale", "op": "ConstantScale", "args": {"scale": 2.0}},
            {"name": "mid", "op": "MakeExtraOutput"},
            {"name": "add", "op": "AddExtraInput", "extra_inputs": {"addend": "r"}},
        ]
    )
    x = _x()
    y, extras = model(x)
    assert list(extras) == ["r", "mid_out"]  # the hidden channel h is not returned
    torch.testing.assert_close(y, 3 * x, rtol=0, atol=0)
    torch.testing.assert_close(extras["r"], x, rtol=0, atol=0)
    torch.testing.assert_close(extras["mid_out"], 2 * x, rtol=0, atol=0)
    dy, dr, dmid = (torch.randn_like(x) for _ in range(3))
    torch.autograd.backward([y, extras["r"], extras["mid_out"]], [dy, dr, dmid])
    # y = 2x + r with r = x: the caller's gradient for r adds to the consumer's.
    torch.testing.assert_close(x.grad, 3 * dy + dr + 2 * dmid)


def test_mixed_public_and_internal_inputs_across_two_fusers() -> None:
    model = _te_model(
        [
            TAP_HIDDEN,
            {"name": "pub", "op": "AddExtraInput"},
            {"name": "add", "op": "AddExtraInput", "extra_inputs": {"addend": "r"}},
            {"name": "squash", "module": "Tanh"},
            {"name": "pub2", "op": "AddExtraInput"},
        ]
    )
    assert [f.num_extra_inputs for f in model.fusers] == [1, 1]
    x = _x()
    a = torch.randn_like(x).requires_grad_(True)
    b = torch.randn_like(x).requires_grad_(True)
    y, _ = model(x, pub2_addend=b, pub_addend=a)
    inner = 2 * x + a
    torch.testing.assert_close(y, torch.tanh(inner) + b)
    dy = torch.randn_like(y)
    y.backward(dy)
    dinner = dy * (1 - torch.tanh(inner.detach()) ** 2)
    torch.testing.assert_close(b.grad, dy)
    torch.testing.assert_close(a.grad, dinner)
    torch.testing.assert_close(x.grad, 2 * dinner)
