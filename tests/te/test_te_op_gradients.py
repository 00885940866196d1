"""Each op as a one-step TE-engine model, outputs and gradients against the oracles (float64, CPU).

``verify`` under ``kernels=reference`` holds the TE engine to the reference engine, which runs the same
op code: an op's math mistake cancels out there. Here the TE engine (TE's real ``OperationFuser``;
TE's own kernels for the ops that have CPU ones, our adapter for the rest) must match hand-derived
formulas. Unbound slots make every extra input and output public, so each one's gradient is checked.
"""

from __future__ import annotations

import pytest
import torch

from te_assembly.catalog import OPS
from te_assembly.engines import build
from te_assembly.engines.target import Target
from te_assembly.jobs.verify import state_dict_parameters
from tests.reference.op_cases import (
    TE_CASES,
    OpCase,
    assert_grad,
    cotangents,
    oracle_result,
    randomize_parameters,
    weighted_sum,
)

pytestmark = pytest.mark.te


def _kernel_choices(case: OpCase) -> list[str]:
    return ["te", "reference"] if OPS[case.op].te_runs_on_cpu else ["reference"]


CASES = [(case, kernels) for case in TE_CASES for kernels in _kernel_choices(case)]


@pytest.mark.parametrize(("case", "kernels"), CASES, ids=[f"{c.id}-{k}" for c, k in CASES])
def test_te_engine_op_matches_the_oracle(case: OpCase, kernels: str) -> None:
    mapping = {
        "name": "one_op",
        "in_features": case.x_shape[-1],
        "ops": [{"name": "op", "op": case.op, "args": case.args}],
    }
    model = build(mapping, Target.of("te", kernels=kernels, dtype=torch.float64))
    assert model.engine == "te"
    prefix = "steps.op."
    params = randomize_parameters(model, case.seed, prefix)
    assert set(params) == set(state_dict_parameters(model))
    spec = OPS[case.op]
    in_slots = [s.name for s in spec.input_slots(case.full_args)]
    out_slots = [s.name for s in spec.output_slots(case.full_args)]
    assert model.input_names == [f"op_{s}" for s in in_slots]
    assert model.output_names == [f"op_{s}" for s in out_slots]

    x, extras = case.inputs()
    y, named = model(x, **dict(zip(model.input_names, extras, strict=True)))
    outputs = [named[f"op_{s}"] for s in out_slots]
    assert y.requires_grad, "the main output is detached"
    for slot, out in zip(out_slots, outputs, strict=True):
        assert out.requires_grad == out.is_floating_point(), f"output {slot}"

    gy, g = cotangents(y, outputs, case.seed)
    own = {n.removeprefix(prefix): p for n, p in params.items()}
    want = oracle_result(case, x, extras, own, gy, g)
    torch.testing.assert_close(y, want.y, rtol=1e-12, atol=1e-12)
    for slot, got_out, want_out in zip(out_slots, outputs, want.outputs, strict=True):
        if got_out.is_floating_point():
            torch.testing.assert_close(got_out, want_out, rtol=1e-12, atol=1e-12, msg=slot)
        else:
            assert torch.equal(got_out, want_out), slot

    float_extras = [(s, e) for s, e in zip(in_slots, extras, strict=True) if e.is_floating_point()]
    wrt = [x, *(e for _, e in float_extras), *params.values()]
    grads = torch.autograd.grad(weighted_sum(y, outputs, gy, g), wrt, allow_unused=True)
    want_extras = [w for w, e in zip(want.grad_extras, extras, strict=True) if e.is_floating_point()]
    labels = ["grad x", *(f"grad {s}" for s, _ in float_extras), *(f"grad {n}" for n in params)]
    expected = [want.grad_x, *want_extras, *(want.grad_params[n.removeprefix(prefix)] for n in params)]
    for label, got, w in zip(labels, grads, expected, strict=True):
        assert w is not None
        assert_grad(label, got, w)
