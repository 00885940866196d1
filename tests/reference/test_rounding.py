"""Reference norms and activations in bfloat16 round once, as TE's kernels do: computed in float32 and
rounded to the output dtype at the end. Written out here from the formulas, independent of the ops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from te_assembly.engines.reference.ops.activations import GELU, ScaledSwiGLU, SwiGLU
from te_assembly.engines.reference.ops.moe import TopKRouter
from te_assembly.engines.reference.ops.norms import LayerNorm, RMSNorm

BF16 = torch.bfloat16


def _x(rows: int = 64, features: int = 96, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, features, generator=gen) * 3 + 1).to(BF16)


@pytest.mark.parametrize("zero_centered", [False, True])
def test_rmsnorm_rounds_once(zero_centered: bool) -> None:
    x = _x()
    norm = RMSNorm(96, eps=1e-5, zero_centered_gamma=zero_centered, dtype=BF16)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(96, generator=torch.Generator().manual_seed(1)).to(BF16) * 0.1)
    x32, w32 = x.float(), norm.weight.float()
    gamma = w32 + 1 if zero_centered else w32
    expected = (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + 1e-5) * gamma).to(BF16)
    y, _ = norm(x)
    assert y.dtype == BF16
    assert torch.equal(y, expected)
    # Rounding every intermediate instead (what the op did before) differs on many elements.
    rstd = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-5)
    assert not torch.equal(x * rstd * (norm.weight + 1 if zero_centered else norm.weight), expected)


def test_layernorm_rounds_once() -> None:
    x = _x(seed=2)
    norm = LayerNorm(96, eps=1e-5, zero_centered_gamma=True, dtype=BF16)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        norm.weight.copy_((torch.randn(96, generator=gen) * 0.1).to(BF16))
        norm.bias.copy_((torch.randn(96, generator=gen) * 0.1).to(BF16))
    x32 = x.float()
    mean, var = x32.mean(-1, keepdim=True), x32.var(-1, unbiased=False, keepdim=True)
    expected = (x32 - mean) / torch.sqrt(var + 1e-5) * (norm.weight.float() + 1) + norm.bias.float()
    y, _ = norm(x)
    # float32 reductions may differ in the last float32 bit from this formula; one bf16 rounding of
    # values that close agrees except at rare ties.
    assert y.dtype == BF16 and (y != expected.to(BF16)).float().mean() < 0.01
    torch.testing.assert_close(y.float(), expected, rtol=2**-8, atol=1e-6)


def test_activations_round_once() -> None:
    x = _x(features=64, seed=4)
    a, b = x.float().chunk(2, dim=-1)
    assert torch.equal(SwiGLU(dtype=BF16)(x)[0], (F.silu(a) * b).to(BF16))
    assert torch.equal(GELU(dtype=BF16)(x)[0], F.gelu(x.float(), approximate="tanh").to(BF16))
    scales = torch.rand(64, generator=torch.Generator().manual_seed(5)) + 0.5  # float32, like router probs
    expected = (F.silu(a) * b * scales.to(BF16).float()[:, None]).to(BF16)  # TE casts scales to x's dtype
    assert torch.equal(ScaledSwiGLU(dtype=BF16)(x, (scales,))[0], expected)


def test_float64_stays_float64() -> None:
    x = torch.randn(8, 16, dtype=torch.float64)
    for op in (RMSNorm(16, dtype=torch.float64), LayerNorm(16, dtype=torch.float64)):
        y, _ = op(x)
        assert y.dtype == torch.float64
    y, _ = RMSNorm(16, dtype=torch.float64)(x)
    torch.testing.assert_close(y, x / x.square().mean(-1, keepdim=True).add(1e-5).sqrt(), rtol=1e-14, atol=0)


def test_bf16_routing_follows_the_float32_norm() -> None:
    """The issue's symptom: a router after a bfloat16 RMSNorm picks the experts that the float32 norm,
    rounded once, implies, so TE (which rounds once) and the reference engine choose alike."""
    for seed in range(20):
        x = _x(rows=256, features=64, seed=seed)
        norm = RMSNorm(64, dtype=BF16)
        torch.manual_seed(seed)
        router = TopKRouter(64, num_experts=4, top_k=2, dtype=BF16)
        once = (x.float() * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + 1e-5)).to(BF16)
        _, (_, chosen, _) = router(norm(x)[0])
        _, (_, expected, _) = router(once)
        assert torch.equal(chosen, expected), seed
