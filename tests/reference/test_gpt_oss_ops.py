"""GPT-OSS's pieces in the reference engine against ``transformers``' own: the clamped GLU of its experts
(interleaved gate | up there, halves here), attention with sinks (its eager formula), and the router's
bias, each in float64 with exact gradients."""

from __future__ import annotations

import pytest
import torch

from te_assembly.engines.reference.attention import Attention
from te_assembly.engines.reference.ops.activations import ClampedSwiGLU, ScaledClampedQGeGLU
from te_assembly.engines.reference.ops.moe import TopKRouter

transformers = pytest.importorskip("transformers", reason="the comparison needs transformers (dev extra)")

F64 = torch.float64


def _experts(limit: float, alpha: float) -> object:
    from transformers.models.gpt_oss import modeling_gpt_oss as gpt

    config = transformers.GptOssConfig(
        hidden_size=8, intermediate_size=6, num_local_experts=2, swiglu_limit=limit, swiglu_alpha=alpha
    )
    return gpt.GptOssExperts(config)


@pytest.mark.parametrize(("limit", "alpha"), [(7.0, 1.702), (0.4, 2.5)])
def test_clamped_glu_equals_gpt_oss_gate(limit: float, alpha: float) -> None:
    """Their gate_up is interleaved (gate, up, gate, up...); ours takes [gate | up] halves."""
    interleaved = torch.randn(5, 12, dtype=F64) * 2  # beyond the small limit: the clamps matter
    halves = torch.cat((interleaved[:, 0::2], interleaved[:, 1::2]), dim=-1)
    expected = _experts(limit, alpha)._apply_gate(interleaved)  # type: ignore[attr-defined]
    op = ClampedSwiGLU(limit=limit, alpha=alpha)
    got, _ = op(halves)
    assert torch.equal(got, expected)
    scales = torch.rand(5, dtype=F64)
    scaled, _ = ScaledClampedQGeGLU(limit=limit, alpha=alpha)(halves, (scales,))
    torch.testing.assert_close(scaled, expected * scales[:, None], rtol=0, atol=1e-15)


def test_clamped_glu_gradients_are_exact_and_zero_where_clamped() -> None:
    op = ScaledClampedQGeGLU(limit=0.5)
    x = torch.randn(4, 8, dtype=F64, requires_grad=True)
    scales = torch.rand(4, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, s: op(a, (s,))[0], (x, scales))
    big = torch.full((1, 8), 3.0, dtype=F64, requires_grad=True)  # gate and up both beyond the limit
    op(big, (torch.ones(1, dtype=F64),))[0].sum().backward()
    assert big.grad is not None and torch.count_nonzero(big.grad) == 0


@pytest.mark.parametrize("window", [None, 3])
def test_attention_with_sinks_equals_gpt_oss_eager(window: int | None) -> None:
    from transformers.models.gpt_oss import modeling_gpt_oss as gpt

    torch.manual_seed(0)
    heads, kv_heads, dim, seq = 4, 2, 8, 7
    mine = Attention(heads, dim, kv_heads, sliding_window=window, sinks=True, dtype=F64)
    with torch.no_grad():
        mine.sinks.copy_(torch.randn(heads, dtype=F64) * 2)
    qkv = torch.randn(2, seq, (heads + 2 * kv_heads) * dim, dtype=F64)
    q, k, v = mine.split_heads(qkv)
    module = torch.nn.Module()
    module.num_key_value_groups = heads // kv_heads  # type: ignore[assignment]
    module.sinks = mine.sinks  # type: ignore[assignment]
    positions = torch.arange(seq)
    behind = positions[:, None] - positions[None, :]
    seen = (behind >= 0) & (behind < (window or seq))
    mask = torch.zeros(seq, seq, dtype=F64).masked_fill(~seen, float("-inf"))[None, None]
    expected, _ = gpt.eager_attention_forward(
        module, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask, scaling=dim**-0.5
    )
    got = mine(qkv).view(2, seq, heads, dim)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-14)
    plain = Attention(heads, dim, kv_heads, sliding_window=window, dtype=F64)(qkv)
    assert not torch.allclose(plain, mine(qkv))  # the sinks take some of each row's weight


def test_sink_gradients_are_exact() -> None:
    torch.manual_seed(1)
    mine = Attention(2, 4, 1, sinks=True, dtype=F64)
    qkv = torch.randn(1, 5, 16, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(mine, (qkv,))
    mine(qkv).sum().backward()
    assert mine.sinks.grad is not None and torch.count_nonzero(mine.sinks.grad) == 2


def test_router_bias_chooses_and_weighs_as_gpt_oss() -> None:
    from transformers.models.gpt_oss import modeling_gpt_oss as gpt

    config = transformers.GptOssConfig(hidden_size=8, num_local_experts=6, num_experts_per_tok=2)
    theirs = gpt.GptOssTopKRouter(config).to(F64)
    mine = TopKRouter(8, 6, 2, bias=True, aux_loss_coeff=0.0, dtype=F64)
    with torch.no_grad():
        theirs.weight.copy_(torch.randn(6, 8, dtype=F64))
        theirs.bias.copy_(torch.randn(6, dtype=F64) * 3)  # large enough to change the choice
        mine.weight.copy_(theirs.weight)
        mine.bias.copy_(theirs.bias)
    x = torch.randn(10, 8, dtype=F64)
    _, scores, indices = theirs(x)
    _, (probs, routing_map, _) = mine(x)
    order = routing_map.sort(dim=-1)
    assert torch.equal(order.values, indices.sort(dim=-1).values)
    torch.testing.assert_close(
        probs.gather(1, order.indices), scores.gather(1, indices.sort(dim=-1).indices), rtol=0, atol=1e-15
    )
