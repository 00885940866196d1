"""Channels read across non-fusible modules (``plan.Reroute``), against closed forms, in both engines:
the reference engine, and TE's real ``OperationFuser`` on CPU (TE's own CPU kernels for MakeExtraOutput,
ConstantScale, Bias and AddExtraInput; ``torch.nn.Tanh`` as the module between fusers; ``te`` tier)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from te_assembly.analysis.pipeline import load
from te_assembly.analysis.plan import Plan
from te_assembly.engines import build
from te_assembly.engines.target import Target
from te_assembly.engines.te.bindings import SET_INPUT, SET_OUTPUT, binding_calls
from te_assembly.engines.te.routing import fuser_io

F64 = torch.float64
WIDTH = 5
ENGINES = [
    pytest.param(("reference", "te"), id="reference"),
    pytest.param(("te", "te"), id="te-fuser-te-cpu-kernels", marks=pytest.mark.te),
    pytest.param(("te", "reference"), id="te-fuser-reference-kernels", marks=pytest.mark.te),
]


def _tap(name: str, channel: str, public: bool = False) -> dict[str, Any]:
    return {
        "name": name,
        "op": "MakeExtraOutput",
        "extra_outputs": {"out": {"channel": channel, "public": public}},
    }


def _add(name: str, channel: str | None) -> dict[str, Any]:
    return {"name": name, "op": "AddExtraInput", "extra_inputs": {"addend": channel}}


def _scale(name: str, scale: float) -> dict[str, Any]:
    return {"name": name, "op": "ConstantScale", "args": {"scale": scale}}


def _tanh(name: str) -> dict[str, Any]:
    return {"name": name, "module": "Tanh"}


def _plan(*ops: dict[str, Any]) -> Plan:
    return load({"name": "rerouted", "in_features": WIDTH, "ops": list(ops)}).checked_plan()


def _run(plan: Plan, engine: tuple[str, str], x: torch.Tensor, **inputs: torch.Tensor) -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = build(plan, Target.of(engine[0], kernels=engine[1], dtype=F64))
    x = x.clone().requires_grad_(True)
    inputs = {k: v.clone().requires_grad_(True) for k, v in inputs.items()}
    y, extras = model(x, **inputs)
    return model, (x, inputs, y, extras)


@pytest.mark.parametrize("engine", ENGINES)
def test_residual_around_a_module(engine: tuple[str, str]) -> None:
    a = 1.5
    plan = _plan(
        _tap("tap", "res"),
        _scale("scale", a),
        _tanh("act"),
        {"name": "bias", "op": "Bias", "args": {"size": WIDTH}},
        _add("add", "res"),
    )
    [reroute] = plan.reroutes
    assert (reroute.channel, reroute.producer_fuser, reroute.consumer_fusers) == ("res", 0, (1,))
    assert [plan.steps[i].name for i in reroute.crosses] == ["act"]
    x = torch.randn(4, WIDTH, dtype=F64)
    model, (xg, _, y, extras) = _run(plan, engine, x)
    b = torch.linspace(-1, 1, WIDTH, dtype=F64)
    with torch.no_grad():
        model.step_module("bias").bias.copy_(b)
    y, extras = model(xg)
    assert extras == {} and model.input_names == [] and model.output_names == []
    torch.testing.assert_close(y, torch.tanh(a * x) + b + x, rtol=0, atol=1e-12)
    g = torch.randn_like(x)
    (y * g).sum().backward()
    t = torch.tanh(a * x)
    torch.testing.assert_close(xg.grad, g * (a * (1 - t**2) + 1), rtol=0, atol=1e-12)
    torch.testing.assert_close(model.step_module("bias").bias.grad, g.sum(0), rtol=0, atol=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_fan_out_to_consumers_in_two_later_fusers(engine: tuple[str, str]) -> None:
    """res feeds a consumer in fuser 1 and one in fuser 2, one of them in the same fuser as another
    consumer: every gradient reaches x once."""
    a, c = 0.7, -1.3
    plan = _plan(
        _tap("tap", "res"),
        _scale("s0", a),
        _tanh("m0"),
        _add("add1", "res"),
        _tanh("m1"),
        _scale("s1", c),
        _add("add2", "res"),
        _add("add3", "res"),
    )
    [reroute] = plan.reroutes
    assert reroute.consumer_fusers == (1, 2)
    assert [r.step for r in reroute.consumers] == [3, 6, 7]
    x = torch.randn(3, WIDTH, dtype=F64)
    _, (xg, _, y, _) = _run(plan, engine, x)
    h = torch.tanh(a * x)
    v = torch.tanh(h + x)
    torch.testing.assert_close(y, c * v + 2 * x, rtol=0, atol=1e-12)
    g = torch.randn_like(x)
    (y * g).sum().backward()
    torch.testing.assert_close(xg.grad, g * (c * (1 - v**2) * (a * (1 - h**2) + 1) + 2), rtol=0, atol=1e-12)


def test_the_channel_gradient_is_the_sum_over_every_consumer() -> None:
    """The reference engine records what reaches the channel: each later consumer's share, summed."""
    c = 2.5
    plan = _plan(
        _tap("tap", "res"), _tanh("m0"), _scale("s", c), _add("add1", "res"), _tanh("m1"), _add("add2", "res")
    )
    torch.manual_seed(0)
    model = build(plan, Target.of("reference", dtype=F64)).record_channels()
    x = torch.randn(2, WIDTH, dtype=F64, requires_grad=True)
    y, _ = model(x)
    g = torch.randn_like(y)
    (y * g).sum().backward()
    v = torch.tanh(c * torch.tanh(x) + x)
    torch.testing.assert_close(model.channel_grads()["res"], g * (1 - v**2) + g, rtol=0, atol=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_public_channel_that_is_also_rerouted(engine: tuple[str, str]) -> None:
    """The caller gets the channel and passes a gradient for it; the later fuser's consumer adds its own,
    and a public input of the later fuser keeps its place in the call."""
    a = 0.9
    plan = _plan(
        _tap("tap", "res", public=True), _scale("s", a), _tanh("m"), _add("ext", None), _add("add", "res")
    )
    assert model_signature(plan) == (["ext_addend"], ["res"])
    x, e = torch.randn(3, WIDTH, dtype=F64), torch.randn(3, WIDTH, dtype=F64)
    _, (xg, inputs, y, extras) = _run(plan, engine, x, ext_addend=e)
    t = torch.tanh(a * x)
    torch.testing.assert_close(y, t + e + x, rtol=0, atol=1e-12)
    torch.testing.assert_close(extras["res"], x, rtol=0, atol=0)
    g, h = torch.randn_like(x), torch.randn_like(x)
    ((y * g).sum() + (extras["res"] * h).sum()).backward()
    torch.testing.assert_close(xg.grad, g * (a * (1 - t**2) + 1) + h, rtol=0, atol=1e-12)
    torch.testing.assert_close(inputs["ext_addend"].grad, g, rtol=0, atol=0)


def model_signature(plan: Plan) -> tuple[list[str], list[str]]:
    return [t.name for t in plan.public_inputs], [t.name for t in plan.public_outputs]


def test_te_bindings_leave_later_consumers_unbound_and_return_the_producer() -> None:
    plan = _plan(
        _tap("tap", "res"), _add("inner", "res"), _tanh("m"), _add("ext", None), _add("outer", "res")
    )
    calls = {(c.step, c.method): c for c in binding_calls(plan)}
    assert calls[("inner", SET_INPUT)].channel == "res"  # the consumer inside the producer's fuser
    assert ("outer", SET_INPUT) not in calls  # across the module: a public input of fuser 1
    assert calls[("tap", SET_OUTPUT)].output_to_caller is True  # hidden in the config, returned by fuser 0
    first, second = fuser_io(plan)
    assert first.inputs == () and first.outputs == ((-1, 0),)  # not the caller's: register 0
    assert second.inputs == (0, -1) and second.outputs == ()  # the caller's ext_addend, then register 0


MODELS_TO_SPLIT = ["moe_block", "residual_mlp", "fanout_mlp"]


def _split_everywhere(name: str) -> list[tuple[int, Plan]]:
    """The model with a ``torch.nn.Identity`` module inserted before each step in turn: every channel
    crossing it is rerouted, and the model computes the same function."""
    base = load(name).resolved.model
    assert base is not None
    out = []
    for k in range(1, len(base["ops"])):
        model = copy.deepcopy(base)
        model["ops"].insert(k, {"name": "cut", "module": "Identity"})
        out.append((k, load(model).checked_plan()))
    return out


@pytest.mark.parametrize(
    "engine",
    [
        pytest.param(("reference", "te"), id="reference"),
        pytest.param(("te", "reference"), id="te", marks=pytest.mark.te),
    ],
)
@pytest.mark.parametrize("name", MODELS_TO_SPLIT)
def test_a_module_anywhere_changes_nothing(name: str, engine: tuple[str, str]) -> None:
    """Outputs, the input gradient and every parameter gradient equal the unsplit model's (same weights,
    float64), wherever a module cuts the fuser, for models whose channels then cross it."""
    whole = load(name).checked_plan()
    torch.manual_seed(0)
    reference = build(whole, Target.of(engine[0], kernels=engine[1], dtype=F64))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in reference.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=F64) * 0.3)
    x = torch.randn(16, whole.in_features, generator=gen, dtype=F64)
    inputs = {
        t.name: torch.randn(16, whole.steps_by_index[t.ref.step].in_width or 1, generator=gen, dtype=F64)
        for t in whole.public_inputs
    }

    def grads(
        model: torch.nn.Module,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        xg = x.clone().requires_grad_(True)
        y, extras = model(xg, **inputs)
        loss = (y * torch.linspace(-1, 1, y.shape[-1], dtype=F64)).sum() + sum(
            v.double().sum() * 0.5 for v in extras.values() if v.is_floating_point()
        )
        loss.backward()
        return (
            y.detach(),
            {k: v.detach() for k, v in extras.items()},
            {n: p.grad for n, p in model.named_parameters()} | {"x": xg.grad},
        )

    expected = grads(reference)
    rerouted = 0
    for k, plan in _split_everywhere(name):
        rerouted += bool(plan.reroutes)
        model = build(plan, Target.of(engine[0], kernels=engine[1], dtype=F64))
        model.load_state_dict(reference.state_dict())
        got = grads(model)
        torch.testing.assert_close(got[0], expected[0], rtol=0, atol=1e-10, msg=f"cut before step {k}")
        assert got[1].keys() == expected[1].keys()
        for key in expected[1]:
            torch.testing.assert_close(got[1][key], expected[1][key], rtol=0, atol=1e-10)
        assert got[2].keys() == expected[2].keys()
        for key in expected[2]:
            torch.testing.assert_close(
                got[2][key], expected[2][key], rtol=0, atol=1e-10, msg=f"{key}, cut {k}"
            )
    assert rerouted >= 3
