"""TE's observable channel behaviours, on the reference engine, against closed-form expectations.

Each model is an inline YAML config; expected outputs and gradients are written out by hand
(docs/te-channels.md, "Calling convention"), never obtained by running the engine a second time.
"""

from __future__ import annotations

import pytest
import torch

from tests.engines._helpers import F64, build_yaml, randomize

T, H = 5, 4


def _x() -> torch.Tensor:
    return torch.randn(T, H, dtype=F64, requires_grad=True)


def _rand() -> torch.Tensor:
    return torch.randn(T, H, dtype=F64)


RESIDUAL = """
name: residual
in_features: 4
ops:
  - name: tap
    op: MakeExtraOutput
    extra_outputs: {{out: {{channel: res, public: {public}}}}}
  - name: bias
    op: Bias
    args: {{size: 4}}
  - name: add
    op: AddExtraInput
    extra_inputs: {{addend: res}}
"""


def test_internal_residual_hidden() -> None:
    model = build_yaml(RESIDUAL.format(public="false"))
    randomize(model)
    b = model.steps["bias"].bias
    x, dy = _x(), _rand()
    y = model.forward_positional(x)
    assert isinstance(y, torch.Tensor), "a model whose only channel is hidden returns a bare tensor"
    torch.testing.assert_close(y, 2 * x + b)
    dx, db = torch.autograd.grad(y, (x, b), dy)
    torch.testing.assert_close(dx, 2 * dy)
    torch.testing.assert_close(db, dy.sum(0))
    assert model(x).extras == {}


def test_internal_residual_public_adds_callers_gradient() -> None:
    model = build_yaml(RESIDUAL.format(public="true")).record_channels()
    randomize(model)
    b = model.steps["bias"].bias
    assert model.output_names == ["res"]
    x, dy, dres = _x(), _rand(), _rand()
    y, res = model.forward_positional(x)
    torch.testing.assert_close(y, 2 * x + b)
    torch.testing.assert_close(res, x)
    torch.autograd.backward((y, res), (dy, dres))
    assert x.grad is not None
    torch.testing.assert_close(x.grad, 2 * dy + dres)
    # The channel itself received its consumer's gradient plus the caller's, nothing from the main path.
    torch.testing.assert_close(model.channel_tensors["res"].grad, dy + dres)


def test_public_output_without_callers_gradient_counts_as_zero() -> None:
    model = build_yaml(RESIDUAL.format(public="true"))
    x, dy = _x(), _rand()
    y, _res = model.forward_positional(x)
    (dx,) = torch.autograd.grad(y, x, dy)
    torch.testing.assert_close(dx, 2 * dy)


UNCONSUMED = """
name: unconsumed
in_features: 4
ops:
  - name: early
    op: MakeExtraOutput                 # unbound: public output early_out, consumed by nobody
  - name: scale
    op: ConstantScale
    args: {scale: 3.0}
  - name: dropped
    op: MakeExtraOutput
    extra_outputs: {out: {channel: dropped, public: false}}   # hidden and never consumed
  - name: bias
    op: Bias
    args: {size: 4}
"""


def test_unconsumed_public_and_hidden_outputs() -> None:
    model = build_yaml(UNCONSUMED).record_channels()
    randomize(model)
    warnings = {(d.code, d.path) for d in model.plan.warnings}
    assert ("unused-hidden-output", "model.ops[2].extra_outputs.out.channel") in warnings
    assert model.output_names == ["early_out"]
    b = model.steps["bias"].bias
    x, dy, dearly = _x(), _rand(), _rand()
    out = model.forward_positional(x)
    assert isinstance(out, tuple) and len(out) == 2, "only the public output is returned"
    y, early = out
    torch.testing.assert_close(y, 3 * x + b)
    torch.testing.assert_close(early, x)
    torch.testing.assert_close(model.channel_tensors["dropped"], 3 * x)
    torch.autograd.backward((y, early), (dy, dearly))
    assert x.grad is not None
    torch.testing.assert_close(x.grad, 3 * dy + dearly)


FANOUT = """
name: fanout
in_features: 4
ops:
  - name: route
    op: MakeExtraOutput
    extra_outputs: {{out: {{channel: route, public: {public}}}}}
  - name: add1
    op: AddExtraInput
    extra_inputs: {{addend: route}}
  - name: add2
    op: AddExtraInput
    extra_inputs: {{addend: route}}
"""


def test_fanout_hidden() -> None:
    model = build_yaml(FANOUT.format(public="false")).record_channels()
    x, dy = _x(), _rand()
    y = model.forward_positional(x)
    assert isinstance(y, torch.Tensor)
    torch.testing.assert_close(y, 3 * x)
    y.backward(dy)
    assert x.grad is not None
    torch.testing.assert_close(x.grad, 3 * dy)
    torch.testing.assert_close(model.channel_tensors["route"].grad, 2 * dy)  # two consumers, summed


def test_fanout_public_sums_consumers_and_caller() -> None:
    model = build_yaml(FANOUT.format(public="true")).record_channels()
    x, dy, droute = _x(), _rand(), _rand()
    y, route = model.forward_positional(x)
    torch.testing.assert_close(y, 3 * x)
    torch.testing.assert_close(route, x)
    torch.autograd.backward((y, route), (dy, droute))
    assert x.grad is not None
    torch.testing.assert_close(x.grad, 3 * dy + droute)
    torch.testing.assert_close(model.channel_tensors["route"].grad, 2 * dy + droute)


MIXED = """
name: mixed
in_features: 4
ops:
  - name: tap
    op: MakeExtraOutput
    extra_outputs: {out: {channel: res, public: false}}
  - name: first
    op: AddExtraInput                   # public input first_addend
  - name: double
    op: ConstantScale
    args: {scale: 2.0}
  - name: add_res
    op: AddExtraInput
    extra_inputs: {addend: res}         # bound: not an argument
  - name: last
    op: AddExtraInput                   # public input last_addend
"""


def test_internal_and_external_inputs_mixed() -> None:
    model = build_yaml(MIXED)
    assert model.input_names == ["first_addend", "last_addend"]
    x, a, c, dy = _x(), _rand().requires_grad_(), _rand().requires_grad_(), _rand()
    expected = 3 * x + 2 * a + c  # 2 (x + a) + res + c, res = x
    by_name = model(x, last_addend=c, first_addend=a).y
    mixed = model(x, a, last_addend=c).y
    positional = model.forward_positional(x, a, c)
    for y in (by_name, mixed, positional):
        assert isinstance(y, torch.Tensor)
        torch.testing.assert_close(y, expected)
    dx, da, dc = torch.autograd.grad(by_name, (x, a, c), dy)
    torch.testing.assert_close(dx, 3 * dy)
    torch.testing.assert_close(da, 2 * dy)
    torch.testing.assert_close(dc, dy)


TWO_FUSERS = """
name: two_fusers
in_features: 4
ops:
  - name: a
    op: AddExtraInput
  - name: squash
    module: Tanh
  - name: b
    op: AddExtraInput
"""


def test_public_inputs_fuser_after_fuser_across_a_module() -> None:
    model = build_yaml(TWO_FUSERS)
    assert [f.steps for f in model.plan.fusers] == [(0,), (2,)]
    assert model.input_names == ["a_addend", "b_addend"]
    x, p, q, dy = _x(), _rand().requires_grad_(), _rand().requires_grad_(), _rand()
    y = model.forward_positional(x, p, q)
    assert isinstance(y, torch.Tensor)
    torch.testing.assert_close(y, torch.tanh(x + p) + q)
    dx, dp, dq = torch.autograd.grad(y, (x, p, q), dy)
    torch.testing.assert_close(dx, dy * (1 - torch.tanh(x + p) ** 2))
    torch.testing.assert_close(dp, dx)
    torch.testing.assert_close(dq, dy)


ROUTER = """
name: router_only
in_features: 4
ops:
  - name: router
    op: TopKRouter
    args: {{in_features: 4, num_experts: 3, top_k: 2, aux_loss_coeff: 0.5}}
    extra_outputs:
      {hidden}: {{channel: kept_inside, public: false}}
"""


def _router_expected(x: torch.Tensor, weight: torch.Tensor) -> dict[str, torch.Tensor]:
    scores = torch.softmax(x @ weight.T, dim=-1)
    top, chosen = scores.topk(2, dim=-1)
    fraction = torch.stack([(chosen == e).sum() for e in range(3)]).to(F64) / chosen.numel()
    aux = 0.5 * 3 * (fraction * scores.mean(0)).sum()
    return {"probs": top / top.sum(-1, keepdim=True), "routing_map": chosen, "aux_loss": aux}


@pytest.mark.parametrize("hidden", ["probs", "routing_map", "aux_loss"])
def test_only_public_slots_are_returned_in_slot_order(hidden: str) -> None:
    model = build_yaml(ROUTER.format(hidden=hidden))
    public = [s for s in ("probs", "routing_map", "aux_loss") if s != hidden]
    assert model.output_names == [f"router_{s}" for s in public]
    x = _x()
    out = model.forward_positional(x)
    assert isinstance(out, tuple) and len(out) == 1 + len(public)
    torch.testing.assert_close(out[0], x)
    expected = _router_expected(x.detach(), model.steps["router"].weight.detach())
    for slot, value in zip(public, out[1:], strict=True):
        if slot == "routing_map":
            assert value.dtype == torch.int64 and torch.equal(value, expected[slot])
        else:
            torch.testing.assert_close(value.detach(), expected[slot])
