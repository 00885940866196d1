"""Every reference op's outputs and gradients in float64, against hand-derived formulas (``oracles.py``)
and against finite differences (``gradcheck``).

Both are needed. An oracle catches a backward that is consistently wrong in a way finite differences
of the same wrong forward would not (none here, but the TE engine borrows these ops); gradcheck catches
an oracle mistake. And ``gradcheck`` silently skips every output that does not require grad (torch 2.14:
``gradcheck(lambda x: (2 * x, (3 * x).detach()), x)`` is True), so each float output's
``requires_grad`` is asserted before it runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import pytest
import torch

from te_assembly.catalog import OPS
from te_assembly.engines.reference.ops.linear import _GroupedMatmul
from tests.reference.op_cases import (
    CASES,
    F64,
    OpCase,
    assert_matches_oracle,
    cotangents,
    oracle_result,
    randomize_parameters,
    weighted_sum,
)
from tests.reference.oracles import grouped_linear

Tensor = torch.Tensor


def assert_float_outputs_need_grad(case: OpCase, y: Tensor, outputs: Sequence[Tensor]) -> None:
    slots = OPS[case.op].output_slots(case.full_args)
    assert y.requires_grad, f"{case.id}: the main output does not require grad"
    for slot, out in zip(slots, outputs, strict=True):
        if slot.dtype == "float":
            assert out.is_floating_point() and out.requires_grad, f"{case.id}: output {slot.name} is detached"
        else:
            assert not out.is_floating_point() and not out.requires_grad, f"{case.id}: output {slot.name}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_outputs_and_gradients_match_the_independent_formulas(case: OpCase) -> None:
    op = case.reference_op()
    params = randomize_parameters(op, case.seed)
    x, extras = case.inputs()
    y, outputs = op(x, extras)
    outputs = list(outputs)
    assert_float_outputs_need_grad(case, y, outputs)
    gy, g = cotangents(y, outputs, case.seed)
    want = oracle_result(case, x, extras, params, gy, g)

    torch.testing.assert_close(y, want.y, rtol=1e-12, atol=1e-12)
    out_slots = OPS[case.op].output_slots(case.full_args)
    for slot, got_out, want_out in zip(out_slots, outputs, want.outputs, strict=True):
        if slot.dtype == "int":
            assert torch.equal(got_out, want_out), f"{case.id}: output {slot.name}"
        else:
            torch.testing.assert_close(got_out, want_out, rtol=1e-12, atol=1e-12, msg=slot.name)

    in_slots = [s.name for s in OPS[case.op].input_slots(case.full_args)]
    float_extras = [(s, e) for s, e in zip(in_slots, extras, strict=True) if e.is_floating_point()]
    wrt = [x, *(e for _, e in float_extras), *params.values()]
    grads = torch.autograd.grad(weighted_sum(y, outputs, gy, g), wrt, allow_unused=True)
    want_extras = [w for w, e in zip(want.grad_extras, extras, strict=True) if e.is_floating_point()]
    assert set(want.grad_params) == set(params), "the oracle and the op disagree on parameter names"
    assert_matches_oracle(
        ["grad x", *(f"grad {s}" for s, _ in float_extras), *(f"grad {n}" for n in params)],
        grads,
        [want.grad_x, *want_extras, *(want.grad_params[n] for n in params)],
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_gradcheck_every_float_output(case: OpCase) -> None:
    op = case.reference_op()
    names = sorted(randomize_parameters(op, case.seed))
    params = [op.get_parameter(n).detach().clone().requires_grad_(True) for n in names]
    x, extras = case.inputs()
    float_at = [i for i, e in enumerate(extras) if e.is_floating_point()]

    def run(x_: Tensor, *rest: Tensor) -> tuple[Tensor, ...]:
        ex = list(extras)
        for i, t in zip(float_at, rest[: len(float_at)], strict=True):
            ex[i] = t
        state = dict(zip(names, rest[len(float_at) :], strict=True))
        y, outs = torch.func.functional_call(op, state, (x_, ex))
        return (y, *(o for o in outs if o.is_floating_point()))

    inputs = (x, *(extras[i] for i in float_at), *params)
    for i, out in enumerate(run(*inputs)):
        assert out.requires_grad, f"float output {i} does not require grad: gradcheck would skip it"
    assert torch.autograd.gradcheck(run, inputs)


def test_router_cases_have_no_near_ties() -> None:
    """gradcheck moves logits by ~1e-6: a top-k choice that close to a tie would flip under it."""
    for case in (c for c in CASES if c.op == "TopKRouter"):
        op = case.reference_op()
        x, _ = case.inputs()
        k, experts = case.full_args["top_k"], case.full_args["num_experts"]
        if k == experts:
            continue
        scores = (x.detach() @ op.get_parameter("weight").detach().T).sort(-1, descending=True).values
        assert (scores[:, k - 1] - scores[:, k]).min() > 1e-3, case.id


@pytest.mark.parametrize("with_bias", [False, True])
def test_grouped_matmul_function_directly(with_bias: bool) -> None:
    """The custom autograd Function under GroupedLinear: its own backward, against the row-by-row oracle
    and finite differences, with an empty group in the middle and at the ends."""
    g = torch.Generator().manual_seed(3)
    sizes = [0, 3, 0, 4, 0]
    x = torch.randn(7, 4, generator=g, dtype=F64, requires_grad=True)
    weights = [torch.randn(5, 4, generator=g, dtype=F64, requires_grad=True) for _ in sizes]
    biases = [torch.randn(5, generator=g, dtype=F64, requires_grad=True) for _ in sizes] if with_bias else []
    y = _grouped_matmul(x, sizes, weights, biases)
    assert y.requires_grad
    gy = torch.randn(y.shape, generator=g, dtype=F64)
    params = {f"weight{i}": w for i, w in enumerate(weights)} | {f"bias{i}": b for i, b in enumerate(biases)}
    with torch.no_grad():
        want = grouped_linear(
            x.detach(), [torch.tensor(sizes)], {n: p.detach() for n, p in params.items()}, gy, []
        )
    torch.testing.assert_close(y, want.y, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad((y * gy).sum(), [x, *params.values()], allow_unused=True)
    assert_matches_oracle(["grad x", *params], grads, [want.grad_x, *(want.grad_params[n] for n in params)])
    assert torch.autograd.gradcheck(
        lambda x_, *ps: _grouped_matmul(x_, sizes, ps[: len(sizes)], ps[len(sizes) :]), (x, *weights, *biases)
    )


def _grouped_matmul(
    x: Tensor, sizes: list[int], weights: Sequence[Tensor], biases: Sequence[Tensor]
) -> Tensor:
    """``_GroupedMatmul.apply`` without bias scales, whether or not this version takes a ``scales``
    argument (the scale_bias path joined the custom Function later; GroupedLinear-scale_bias covers it)."""
    if "scales" in inspect.signature(_GroupedMatmul.forward).parameters:
        return _GroupedMatmul.apply(x, None, sizes, len(biases), *weights, *biases)
    return _GroupedMatmul.apply(x, sizes, len(biases), *weights, *biases)
