"""Dispatch's alignment through TE's real fuser (``engine=te kernels=reference`` on CPU): the padded MoE
block is the unpadded block, output, aux loss and every gradient, in float64, at any alignment and with
an expert that receives no tokens. The padding rows travel through TE's channel routing (split_sizes to
both GroupedLinears, row_probs to ScaledSwiGLU, row_map to Combine) and its gradient accumulation."""

from __future__ import annotations

import pytest
import torch

from te_assembly import load
from te_assembly.engines import Target, build
from te_assembly.engines.base import AssembledModel
from te_assembly.jobs.verify import copy_weights, fill_constant_parameters, state_dict_parameters

pytestmark = pytest.mark.te

F64 = torch.float64
TOKENS = 24


def _model(engine: str, align: int) -> AssembledModel:
    dims = ["model.dims.hidden=16", "model.dims.ffn=8", "model.dims.experts=4", f"model.dims.align={align}"]
    plan = load("moe_block", dims).checked_plan()
    torch.manual_seed(0)
    kernels = "reference" if engine == "te" else "te"
    return build(plan, Target.of(engine, kernels=kernels, dtype=F64))


def _starve_expert_3(model: AssembledModel) -> torch.Tensor:
    """Router weights under which expert 3 is never in a token's top 2, and an input to go with them."""
    with torch.no_grad():
        weight = dict(state_dict_parameters(model))["steps.router.weight"]
        weight.clamp_(-0.3, 0.3)
        weight[3] = 0.0
        weight[3, 0] = -5.0
    x = torch.randn(TOKENS, 16, dtype=F64, generator=torch.Generator().manual_seed(4))
    x[:, 0] = x[:, 0].abs() + 5.0  # RMSNorm keeps the sign: feature 0 stays large and positive
    return x


def _run(model: AssembledModel, x: torch.Tensor) -> dict[str, torch.Tensor]:
    xx = x.clone().requires_grad_(True)
    y, extras = model(xx)
    dy = torch.randn(y.shape, dtype=F64, generator=torch.Generator().manual_seed(5))
    ((y * dy).sum() + 3.0 * extras["aux_loss"]).backward()
    out = {"y": y.detach(), "aux_loss": extras["aux_loss"].detach(), "grad x": xx.grad}
    for name, p in state_dict_parameters(model).items():
        assert p.grad is not None, name
        out[f"grad {name}"] = p.grad
    return out


@pytest.mark.parametrize("starve", [False, True], ids=["all-experts", "expert-without-tokens"])
@pytest.mark.parametrize("align", [2, 5, 16, 128])
def test_aligned_block_in_te_equals_unpadded_reference(align: int, starve: bool) -> None:
    reference = _model("reference", align=1)
    fill_constant_parameters(reference, seed=0)
    x = _starve_expert_3(reference) if starve else torch.randn(TOKENS, 16, dtype=F64)
    te_model = _model("te", align=align)
    copy_weights(reference, te_model)
    want, got = _run(reference, x), _run(te_model, x)
    assert set(got) == set(want)
    for name in want:
        torch.testing.assert_close(
            got[name], want[name], rtol=1e-12, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}"
        )
    if starve:
        # The starved expert's weights get exactly zero gradient; the others do not.
        assert torch.count_nonzero(want["grad steps.fc1.weight3"]) == 0
        assert torch.count_nonzero(got["grad steps.fc1.weight0"]) > 0


def test_padding_is_really_there() -> None:
    """The reference engine with the same alignment shows the padded channels TE routed above."""
    model = _model("reference", align=16)
    model.record_channels()
    model(torch.randn(TOKENS, 16, dtype=F64))
    sizes, row_map = model.channel_tensors["split_sizes"], model.channel_tensors["row_map"]
    assert all(int(s) % 16 == 0 for s in sizes) and int((row_map < 0).sum()) > 0
    assert int((row_map >= 0).sum()) == TOKENS * 2
