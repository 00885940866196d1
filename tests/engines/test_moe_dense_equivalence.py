"""moe_block equals a naive dense mixture of experts written out here, in both engines.

The dense version shares no code with te_assembly: per-token softmax/top-k/renormalise, every
expert applied to every token and weighted by its gate, the RMSNorm and the load-balancing loss by
hand. It is the standard mixture (Megatron-Core, Mixtral): y = x + sum_k p_k * (FC2_k(h) + b2_k),
so the router probability weights each expert's fc2 bias too. Every parameter (both layers' biases
included) is random and nonzero. Output, aux loss and every gradient (input, router, norm, both
layers' weights and biases) must agree in float64, in the reference engine and in TE's fuser
(``engine=te kernels=reference``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from te_assembly.analysis.pipeline import load
from te_assembly.engines import build
from te_assembly.engines.base import AssembledModel
from te_assembly.engines.target import Target
from tests.engines._helpers import F64, randomize

TOKENS = 12
ENGINES = [
    pytest.param(("reference", "te"), id="reference"),
    pytest.param(("te", "reference"), id="te-kernels-reference", marks=pytest.mark.te),
]


def _moe_block(
    engine: tuple[str, str], hidden: int, ffn: int, experts: int, top_k: int, align: int = 1
) -> AssembledModel:
    dims = {"hidden": hidden, "ffn": ffn, "experts": experts, "top_k": top_k, "align": align}
    loaded = load("moe_block", [f"model.dims.{k}={v}" for k, v in dims.items()])
    torch.manual_seed(0)
    model = build(loaded.checked_plan(), Target.of(engine[0], kernels=engine[1], dtype=F64))
    randomize(model)
    return model


def dense_moe(
    x: torch.Tensor,
    p: dict[str, torch.Tensor],
    experts: int,
    top_k: int,
    coeff: float,
    eps: float,
    *,
    scale_fc2_bias: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, aux_loss) of the pre-norm top-k SwiGLU MoE block with an added residual.

    ``scale_fc2_bias=False`` is the function the block computed before fc2 scaled its bias (each
    chosen expert's fc2 bias added unweighted): only used to show the test tells the two apart."""
    h = x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * p["steps.norm.weight"]
    logits = h @ p["steps.router.weight"].T
    gates, chosen, all_scores = [], [], []
    for t in range(x.shape[0]):  # each token routes itself
        scores = torch.softmax(logits[t], dim=0)
        top, idx = torch.topk(scores, top_k)
        gates.append(torch.zeros(experts, dtype=x.dtype).index_put((idx,), top / top.sum()))
        chosen.append(torch.zeros(experts, dtype=x.dtype).index_put((idx,), torch.ones(top_k, dtype=x.dtype)))
        all_scores.append(scores)
    gate, mask, scores = torch.stack(gates), torch.stack(chosen), torch.stack(all_scores)
    out = x.clone()  # the residual
    for e in range(experts):
        a = h @ p[f"steps.fc1.weight{e}"].T + p[f"steps.fc1.bias{e}"]
        up_gate, up = a.chunk(2, dim=-1)  # TE's SwiGLU activates the first half
        expert = (F.silu(up_gate) * up) @ p[f"steps.fc2.weight{e}"].T + p[f"steps.fc2.bias{e}"]
        if scale_fc2_bias:
            out = out + gate[:, e : e + 1] * expert  # zero gate for an expert the token did not pick
        else:
            out = out + gate[:, e : e + 1] * (expert - p[f"steps.fc2.bias{e}"])
            out = out + mask[:, e : e + 1] * p[f"steps.fc2.bias{e}"]
    fraction = mask.sum(dim=0) / (x.shape[0] * top_k)
    aux = coeff * experts * (fraction * scores.mean(dim=0)).sum()
    return out, aux


def _dense_args(model: AssembledModel) -> tuple[int, int, float, float]:
    router = model.plan.step("router").args
    eps = model.plan.step("norm").args["eps"]
    return router["num_experts"], router["top_k"], router["aux_loss_coeff"], eps


def _compare(model: AssembledModel, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Assert the engine equals the dense mixture; return the engine's gradients by name."""
    experts, top_k, coeff, eps = _dense_args(model)
    names = list(dict(model.named_parameters()))
    params = [p for _, p in model.named_parameters()]
    # Both layers' biases are live: a bias bug cannot hide behind TE's zero initialisation.
    for layer in ("fc1", "fc2"):
        assert all(model.get_parameter(f"steps.{layer}.bias{e}").abs().min() > 0 for e in range(experts))
    mine = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    gen = torch.Generator().manual_seed(5)
    dy = torch.randn(x.shape, generator=gen, dtype=F64)
    aux_weight = 3.0

    x_engine = x.clone().requires_grad_(True)
    y, extras = model(x_engine)
    loss = (y * dy).sum() + aux_weight * extras["aux_loss"]
    grads = torch.autograd.grad(loss, [x_engine, *params])

    x_dense = x.clone().requires_grad_(True)
    y_ref, aux_ref = dense_moe(x_dense, mine, experts, top_k, coeff, eps)
    loss_ref = (y_ref * dy).sum() + aux_weight * aux_ref
    grads_ref = torch.autograd.grad(loss_ref, [x_dense, *(mine[n] for n in names)])

    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(extras["aux_loss"], aux_ref)
    for name, got, want in zip(["x", *names], grads, grads_ref, strict=True):
        torch.testing.assert_close(got, want, msg=lambda m, name=name: f"gradient of {name}: {m}")
    assert grads[names.index("steps.router.weight") + 1].abs().sum() > 0
    return dict(zip(["x", *names], grads, strict=True))


# align pads each expert's group with zero rows of probability 0, which Combine drops: the block is
# the same function with the same gradients at every alignment (16 is FP8's, 5 divides nothing). A
# padded row's fc2 bias is scaled by its probability 0, so it adds nothing either.
ALIGNS = [1, 5, 16]


@pytest.mark.parametrize("align", ALIGNS)
@pytest.mark.parametrize("engine", ENGINES)
def test_moe_block_matches_dense_mixture(engine: tuple[str, str], align: int) -> None:
    model = _moe_block(engine, hidden=8, ffn=6, experts=4, top_k=2, align=align)
    x = torch.randn(TOKENS, 8, generator=torch.Generator().manual_seed(3), dtype=F64)
    _compare(model, x)


@pytest.mark.parametrize("engine", ENGINES)
def test_expert_bias_is_weighted_by_the_router_probability(engine: tuple[str, str]) -> None:
    """The dense reference of this file separates the standard mixture from the old unweighted fc2
    bias by far more than the tolerance, and the block is the standard one."""
    model = _moe_block(engine, hidden=8, ffn=6, experts=4, top_k=2)
    x = torch.randn(TOKENS, 8, generator=torch.Generator().manual_seed(3), dtype=F64)
    experts, top_k, coeff, eps = _dense_args(model)
    params = {n: p.detach() for n, p in model.named_parameters()}
    with torch.no_grad():
        y = model(x).y
        standard, _ = dense_moe(x, params, experts, top_k, coeff, eps)
        unweighted, _ = dense_moe(x, params, experts, top_k, coeff, eps, scale_fc2_bias=False)
    assert (standard - unweighted).abs().max() > 0.1
    torch.testing.assert_close(y, standard)
    # With every fc2 bias zero the two functions coincide: the difference is the bias alone.
    with torch.no_grad():
        for e in range(experts):
            model.get_parameter(f"steps.fc2.bias{e}").zero_()
        zeroed = {n: p.detach() for n, p in model.named_parameters()}
        torch.testing.assert_close(
            dense_moe(x, zeroed, experts, top_k, coeff, eps)[0],
            dense_moe(x, zeroed, experts, top_k, coeff, eps, scale_fc2_bias=False)[0],
        )


@pytest.mark.parametrize("align", ALIGNS)
@pytest.mark.parametrize("engine", ENGINES)
def test_moe_block_expert_without_tokens(engine: tuple[str, str], align: int) -> None:
    model = _moe_block(engine, hidden=8, ffn=6, experts=4, top_k=2, align=align)
    with torch.no_grad():
        model.get_parameter("steps.norm.weight").copy_(torch.ones(8, dtype=F64))
        weight = model.get_parameter("steps.router.weight")
        weight.clamp_(-0.3, 0.3)
        weight[3] = 0.0
        weight[3, 0] = -5.0  # every token has a large positive feature 0: expert 3 always scores lowest
    x = torch.randn(TOKENS, 8, generator=torch.Generator().manual_seed(4), dtype=F64)
    x[:, 0] += 10.0
    record = getattr(model, "record_channels", None)
    if record is not None:
        record()
    grads = _compare(model, x)
    if record is not None:
        channels = model.channel_tensors  # type: ignore[attr-defined]
        split_sizes, row_map = channels["split_sizes"], channels["row_map"]
        assert split_sizes[3].item() == 0 and all(int(s) % align == 0 for s in split_sizes)
        assert split_sizes.sum().item() == row_map.numel() and int((row_map >= 0).sum()) == TOKENS * 2
        if align > 1:
            assert int((row_map < 0).sum()) > 0, "the routing should need padding at this alignment"
    # An expert without tokens gets no gradient, its biases included; the others do.
    for name in ("weight3", "bias3"):
        assert not grads[f"steps.fc2.{name}"].any() and not grads[f"steps.fc1.{name}"].any()
    assert grads["steps.fc2.bias0"].abs().min() > 0


@pytest.mark.parametrize("engine", ENGINES)
def test_moe_block_top_k_equals_num_experts(engine: tuple[str, str]) -> None:
    model = _moe_block(engine, hidden=8, ffn=6, experts=3, top_k=3)
    x = torch.randn(TOKENS, 8, generator=torch.Generator().manual_seed(6), dtype=F64)
    _compare(model, x)


@pytest.mark.parametrize("engine", ENGINES)
def test_moe_block_top_1(engine: tuple[str, str]) -> None:
    # Renormalised top-1 probabilities are all 1: the router learns only through the aux loss.
    model = _moe_block(engine, hidden=8, ffn=6, experts=4, top_k=1)
    x = torch.randn(TOKENS, 8, generator=torch.Generator().manual_seed(7), dtype=F64)
    _compare(model, x)
