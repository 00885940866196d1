"""Whole blocks, both engines, against the oracles (``tests/reference/oracles.py``) in float64.

``verify`` compares the TE engine with the reference engine; under ``kernels=reference`` both run the
same op code, so an op whose math is wrong passes it. Here each engine's outputs and every gradient
(x, public inputs, each parameter) must equal a forward and reverse pass computed from hand-derived
formulas and the config format's channel rules alone: channel gradients summed over consumers plus
the caller's cotangent, int channels carrying no gradient. The ``te`` cases run TE's real
``OperationFuser``, with TE's own CPU kernels where every op has one (``kernels=te``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import yaml

from te_assembly.catalog import OPS
from te_assembly.engines import build
from te_assembly.engines.data import sample_public_inputs
from te_assembly.engines.target import Target
from te_assembly.jobs.verify import state_dict_parameters
from tests.reference.op_cases import assert_grad
from tests.reference.oracles import run_model

F64 = torch.float64

MLP = """
name: grad_mlp
in_features: 6
ops:
  - name: residual
    op: MakeExtraOutput
    extra_outputs: {out: {channel: residual, public: false}}
  - name: norm
    op: LayerNorm
    args: {normalized_shape: 6}
  - name: fc1
    op: Linear
    args: {in_features: 6, out_features: 10}
  - name: act
    op: SwiGLU
  - name: fc2
    op: Linear
    args: {in_features: 5, out_features: 6}
  - name: add_residual
    op: AddExtraInput
    extra_inputs: {addend: residual}
"""

MOE = """
name: grad_moe
in_features: 6
ops:
  - name: residual
    op: MakeExtraOutput
    extra_outputs: {out: {channel: residual, public: false}}
  - name: norm
    op: RMSNorm
    args: {normalized_shape: 6, zero_centered_gamma: true}
  - name: router
    op: TopKRouter
    args: {in_features: 6, num_experts: 4, top_k: 2, aux_loss_coeff: 0.1, score_function: SCORE}
    extra_outputs:
      probs: {channel: probs, public: true}       # consumed and returned: both gradients add up
      routing_map: {channel: routing_map, public: false}
      aux_loss: {channel: aux_loss, public: true}
  - name: dispatch
    op: Dispatch
    args: {num_experts: 4, top_k: 2}
    extra_inputs: {probs: probs, routing_map: routing_map}
    extra_outputs:
      split_sizes: {channel: split_sizes, public: false}
      row_probs: {channel: row_probs, public: false}
      row_map: {channel: row_map, public: false}
  - name: fc1
    op: GroupedLinear
    args: {num_groups: 4, in_features: 6, out_features: 10}
    extra_inputs: {split_sizes: split_sizes}
  - name: act
    op: ScaledSwiGLU
    extra_inputs: {scales: row_probs}
  - name: fc2
    op: GroupedLinear
    args: {num_groups: 4, in_features: 5, out_features: 6, scale_bias: true}
    extra_inputs: {split_sizes: split_sizes, scales: row_probs}   # row_probs fans out to act and fc2
  - name: combine
    op: Combine
    args: {top_k: 2}
    extra_inputs: {row_map: row_map}
  - name: add_residual
    op: AddExtraInput
    extra_inputs: {addend: residual}
"""

FANOUT = """
name: grad_fanout
in_features: 5
ops:
  - name: tap
    op: MakeExtraOutput
    extra_outputs: {out: {channel: t, public: true}}
  - name: act
    op: QGELU
  - name: add1
    op: AddExtraInput
    extra_inputs: {addend: t}
  - name: scale
    op: ConstantScale
    args: {scale: -0.5}
  - name: add2
    op: AddExtraInput
    extra_inputs: {addend: t}
  - name: bias
    op: Bias
    args: {size: 5}
  - name: add_public
    op: AddExtraInput
  - name: norm
    op: LayerNorm
    args: {normalized_shape: 5, zero_centered_gamma: true}
"""

TE_CPU = """
name: grad_te_cpu
in_features: 5
ops:
  - name: tap
    op: MakeExtraOutput
    extra_outputs: {out: {channel: t, public: true}}
  - name: bias
    op: Bias
    args: {size: 5}
  - name: add1
    op: AddExtraInput
    extra_inputs: {addend: t}
  - name: scale
    op: ConstantScale
    args: {scale: 3.0}
  - name: tap2
    op: MakeExtraOutput
    extra_outputs: {out: {channel: u, public: false}}
  - name: add2
    op: AddExtraInput
    extra_inputs: {addend: t}
  - name: add3
    op: AddExtraInput
    extra_inputs: {addend: u}
  - name: add_public
    op: AddExtraInput
"""
"""Only ops whose TE kernels run on CPU: the TE engine runs TE's own code for every op."""

MODELS = {
    "mlp": MLP,
    "moe-softmax": MOE.replace("SCORE", "softmax"),
    "moe-sigmoid": MOE.replace("SCORE", "sigmoid"),
    "fanout": FANOUT,
    "te_cpu": TE_CPU,
}


def _kernels(mapping: dict[str, Any]) -> str:
    return "te" if all(OPS[s["op"]].te_runs_on_cpu for s in mapping["ops"]) else "reference"


def check_block_against_oracles(mapping: dict[str, Any], engine: str, seed: int = 0) -> None:
    model = build(mapping, Target.of(engine, kernels=_kernels(mapping), dtype=F64))
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    params = state_dict_parameters(model)
    with torch.no_grad():
        for name in sorted(params):
            params[name].copy_(torch.randn(params[name].shape, generator=gen, dtype=F64) * 0.5)
    x = torch.randn(7, mapping["in_features"], generator=gen, dtype=F64)
    inputs = sample_public_inputs(model.plan, 7, generator=gen, device=torch.device("cpu"), dtype=F64)

    xx = x.clone().requires_grad_(True)
    ins = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in inputs.items()}
    y, extras = model(xx, **ins)
    float_outputs = {k: v for k, v in extras.items() if v.is_floating_point()}
    assert y.requires_grad and all(v.requires_grad for v in float_outputs.values()), (
        "a float output is detached"
    )
    gy = torch.randn(y.shape, generator=gen, dtype=F64)
    g_outputs = {k: torch.randn(v.shape, generator=gen, dtype=F64) for k, v in float_outputs.items()}
    loss = (y * gy).sum() + sum((v * g_outputs[k]).sum() for k, v in float_outputs.items())
    float_inputs = {k: v for k, v in ins.items() if v.is_floating_point()}
    wrt = [xx, *float_inputs.values(), *params.values()]
    grads = dict(
        zip(["x", *float_inputs, *params], torch.autograd.grad(loss, wrt, allow_unused=True), strict=True)
    )

    with torch.no_grad():
        want = run_model(mapping, {k: p.detach() for k, p in params.items()}, x, inputs, gy, g_outputs)
    torch.testing.assert_close(y, want.y, rtol=1e-10, atol=1e-12)
    assert set(extras) == set(want.outputs)
    for name, value in extras.items():
        if value.is_floating_point():
            torch.testing.assert_close(value, want.outputs[name], rtol=1e-10, atol=1e-12, msg=name)
        else:
            assert torch.equal(value, want.outputs[name]), name
    assert set(want.grad_params) == set(params)
    assert_grad("grad x", grads["x"], want.grad_x)
    for name in float_inputs:
        assert_grad(f"grad {name}", grads[name], want.grad_inputs[name])
    for name in params:
        assert_grad(f"grad {name}", grads[name], want.grad_params[name])


@pytest.mark.parametrize("engine", ["reference", pytest.param("te", marks=pytest.mark.te)])
@pytest.mark.parametrize("model", MODELS, ids=str)
def test_block_outputs_and_gradients_match_the_oracles(model: str, engine: str) -> None:
    check_block_against_oracles(yaml.safe_load(MODELS[model]), engine)
