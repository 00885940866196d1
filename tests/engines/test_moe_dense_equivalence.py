"""moe_block on the reference engine equals a naive dense mixture of experts written out here.

The dense version shares no code with te_assembly: per-token softmax/top-k/renormalise, every
expert applied to every token and masked, the RMSNorm and the load-balancing loss by hand. Output
and every parameter gradient (router weight included, through the probabilities and the aux loss)
must agree in float64.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from te_assembly.engines import build
from te_assembly.engines.reference import ReferenceModel
from te_assembly.pipeline import load
from tests.engines._helpers import F64, randomize

TOKENS = 12


def _moe_block(hidden: int, ffn: int, experts: int, top_k: int, align: int = 1) -> ReferenceModel:
    dims = {"hidden": hidden, "ffn": ffn, "experts": experts, "top_k": top_k, "align": align}
    loaded = load("moe_block", [f"model.dims.{k}={v}" for k, v in dims.items()])
    torch.manual_seed(0)
    model = build(loaded.checked_plan(), engine="reference", dtype=F64)
    assert isinstance(model, ReferenceModel)
    randomize(model)
    return model


def dense_moe(
    x: torch.Tensor, p: dict[str, torch.Tensor], experts: int, top_k: int, coeff: float, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, aux_loss) of the pre-norm top-k SwiGLU MoE block with an added residual."""
    h = x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * p["steps.norm.weight"]
    logits = h @ p["steps.router.weight"].T
    gates, chosen, all_scores = [], [], []
    for t in range(x.shape[0]):  # each token routes itself
        scores = torch.softmax(logits[t], dim=0)
        top, idx = torch.topk(scores, top_k)
        gate = torch.zeros(experts, dtype=x.dtype).index_put((idx,), top / top.sum())
        gates.append(gate)
        chosen.append(torch.zeros(experts, dtype=x.dtype).index_put((idx,), torch.ones(top_k, dtype=x.dtype)))
        all_scores.append(scores)
    gate, mask, scores = torch.stack(gates), torch.stack(chosen), torch.stack(all_scores)
    out = x.clone()  # the residual
    for e in range(experts):
        a = h @ p[f"steps.fc1.weight{e}"].T + p[f"steps.fc1.bias{e}"]
        up_gate, up = a.chunk(2, dim=-1)  # TE's SwiGLU activates the first half
        act = F.silu(up_gate) * up * gate[:, e : e + 1]  # ScaledSwiGLU scales by the router probability
        expert_out = act @ p[f"steps.fc2.weight{e}"].T + p[f"steps.fc2.bias{e}"]
        out = out + mask[:, e : e + 1] * expert_out  # a chosen expert's fc2 bias is not prob-scaled
    fraction = mask.sum(dim=0) / (x.shape[0] * top_k)
    aux = coeff * experts * (fraction * scores.mean(dim=0)).sum()
    return out, aux


def _compare(model: ReferenceModel, x: torch.Tensor) -> None:
    router = model.plan.step("router").args
    experts, top_k = router["num_experts"], router["top_k"]
    eps = model.plan.step("norm").args["eps"]
    names = list(dict(model.named_parameters()))
    params = [p for _, p in model.named_parameters()]
    mine = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    gen = torch.Generator().manual_seed(5)
    dy = torch.randn(x.shape, generator=gen, dtype=F64)
    aux_weight = 3.0

    x_engine = x.clone().requires_grad_(True)
    y, extras = model(x_engine)
    loss = (y * dy).sum() + aux_weight * extras["aux_loss"]
    grads = torch.autograd.grad(loss, [x_engine, *params])

    x_dense = x.clone().requires_grad_(True)
    y_ref, aux_ref = dense_moe(x_dense, mine, experts, top_k, router["aux_loss_coeff"], eps)
    loss_ref = (y_ref * dy).sum() + aux_weight * aux_ref
    grads_ref = torch.autograd.grad(loss_ref, [x_dense, *(mine[n] for n in names)])

    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(extras["aux_loss"], aux_ref)
    for name, got, want in zip(["x", *names], grads, grads_ref, strict=True):
        torch.testing.assert_close(got, want, msg=lambda m, name=name: f"gradient of {name}: {m}")
    assert grads[names.index("steps.router.weight") + 1].abs().sum() > 0


# align pads each expert's group with zero rows of probability 0, which Combine drops: the block is
# the same function with the same gradients at every alignment (16 is FP8's, 5 divides nothing).
ALIGNS = [1, 5, 16]


@pytest.mark.parametrize("align", ALIGNS)
def test_moe_block_matches_dense_mixture(align: int) -> None:
    model = _moe_block(hidden=8, ffn=6, experts=4, top_k=2, align=align)
    x = torch.randn(TOKENS, 8, generator=torch.Generator().manual_seed(3), dtype=F64)
    _compare(model, x)


@pytest.mark.parametrize("align", ALIGNS)
def test_moe_block_expert_without_tokens(align: int) -> None:
    model = _moe_block(hidden=8, ffn=6, experts=4, top_k=2, align=align)
    with torch.no_grad():
        model.steps["norm"].weight.copy_(torch.ones(8, dtype=F64))
        weight = model.steps["router"].weight
        weight.clamp_(-0.3, 0.3)
        weight[3] = 0.0
        weight[3, 0] = -5.0  # every token has a large positive feature 0: expert 3 always scores lowest
    x = torch.randn(TOKENS, 8, generator=torch.Generator().manual_seed(4), dtype=F64)
    x[:, 0] += 10.0
    model.record_channels()
    _compare(model, x)
    split_sizes, row_map = model.channel_tensors["split_sizes"], model.channel_tensors["row_map"]
    assert split_sizes[3].item() == 0 and all(int(s) % align == 0 for s in split_sizes)
    assert split_sizes.sum().item() == row_map.numel() and int((row_map >= 0).sum()) == TOKENS * 2
    if align > 1:
        assert int((row_map < 0).sum()) > 0, "the routing should need padding at this alignment"


def test_moe_block_top_k_equals_num_experts() -> None:
    model = _moe_block(hidden=8, ffn=6, experts=3, top_k=3)
    x = torch.randn(TOKENS, 8, generator=torch.Generator().manual_seed(6), dtype=F64)
    _compare(model, x)


def test_moe_block_top_1() -> None:
    # Renormalised top-1 probabilities are all 1: the router learns only through the aux loss.
    model = _moe_block(hidden=8, ffn=6, experts=4, top_k=1)
    x = torch.randn(TOKENS, 8, generator=torch.Generator().manual_seed(7), dtype=F64)
    _compare(model, x)
