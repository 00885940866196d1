"""The reference ``Attention`` module against attention written out the long way (``naive_attention``:
loops, float64, GQA and RoPE from their definitions): forward, the gradient of the packed input, and
torch's gradcheck."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from te_assembly.engines.reference.attention import Attention, twice_differentiable
from tests.reference.naive_attention import naive_attention, rotate_pairs

CASES = [
    # heads, kv heads, head_dim, causal, rotary, seq
    (2, 2, 4, True, False, 5),  # plain multi-head causal
    (4, 2, 4, True, True, 6),  # GQA + RoPE
    (4, 1, 6, True, True, 3),  # multi-query + RoPE, head_dim not a power of two
    (3, 3, 4, False, True, 4),  # not causal
    (6, 2, 2, True, False, 7),  # three query heads per kv head
]


def _packed(batch: int, seq: int, h: int, g: int, d: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq, (h + 2 * g) * d, generator=generator, dtype=torch.float64)


def _tolerance(rotary: bool) -> dict[str, float]:
    # The naive reference rounds its rotary tables to float32 scalar by scalar, as the module (and TE
    # and transformers) make them in float32; a frequency's exponent 2j/d is rounded from float64 there,
    # which can leave one float32 ulp between the two tables.
    return {"rtol": 1e-6, "atol": 1e-6} if rotary else {"rtol": 1e-12, "atol": 1e-12}


@pytest.mark.parametrize(("h", "g", "d", "causal", "rotary", "seq"), CASES)
def test_forward_matches_the_naive_attention(
    h: int, g: int, d: int, causal: bool, rotary: bool, seq: int
) -> None:
    qkv = _packed(2, seq, h, g, d)
    module = Attention(h, d, g, causal=causal, rotary=rotary, rotary_base=100.0)
    got = module(qkv)
    want = naive_attention(qkv, h, g, d, causal=causal, rotary=rotary, base=100.0)
    assert got.shape == (2, seq, h * d) and got.dtype == torch.float64
    torch.testing.assert_close(got, want, **_tolerance(rotary))


@pytest.mark.parametrize(("h", "g", "d", "causal", "rotary", "seq"), CASES)
def test_gradients_match_the_naive_attention(
    h: int, g: int, d: int, causal: bool, rotary: bool, seq: int
) -> None:
    qkv = _packed(2, seq, h, g, d, seed=1)
    cotangent = torch.randn(2, seq, h * d, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    mine = qkv.clone().requires_grad_(True)
    (Attention(h, d, g, causal=causal, rotary=rotary)(mine) * cotangent).sum().backward()
    theirs = qkv.clone().requires_grad_(True)
    (naive_attention(theirs, h, g, d, causal=causal, rotary=rotary) * cotangent).sum().backward()
    assert mine.grad is not None and theirs.grad is not None
    torch.testing.assert_close(mine.grad, theirs.grad, **_tolerance(rotary))


def test_gradcheck_with_gqa_and_rotary() -> None:
    module = Attention(4, 4, 2, rotary=True)
    qkv = _packed(1, 4, 4, 2, 4).requires_grad_(True)
    assert torch.autograd.gradcheck(module, (qkv,))
    with twice_differentiable():
        assert torch.autograd.gradgradcheck(module, (qkv,))


@pytest.mark.parametrize("window", [None, 3])
def test_fast_kernel_and_math_backend_agree_and_only_math_differentiates_twice(window: int | None) -> None:
    """Outside ``twice_differentiable`` SDPA picks its fast kernel (training speed); inside, the math
    backend: the same values and gradients to float64 rounding, and only the second has a second
    derivative."""
    module = Attention(4, 8, 2, rotary=True, sliding_window=window)
    qkv = _packed(2, 7, 4, 2, 8, seed=3)
    results = []
    for twice in (False, True):
        x = qkv.clone().requires_grad_(True)
        with twice_differentiable() if twice else contextlib.nullcontext():
            y = module(x)
            (grad,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
        results.append((y.detach(), grad.detach()))
        if twice:
            (again,) = torch.autograd.grad(grad.sum(), x)
            assert again.abs().sum() > 0
        else:
            with pytest.raises(RuntimeError, match="not implemented"):
                torch.autograd.grad(grad.sum(), x)
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-12, atol=1e-12)


def test_causal_means_no_position_sees_a_later_one() -> None:
    qkv = _packed(1, 6, 2, 1, 4)
    module = Attention(2, 4, 1, rotary=True)
    before = module(qkv)
    changed = qkv.clone()
    changed[:, 4:] += 10.0  # the last two positions only
    after = module(changed)
    torch.testing.assert_close(after[:, :4], before[:, :4], rtol=0, atol=0)
    assert not torch.allclose(after[:, 4:], before[:, 4:])


def test_query_heads_read_their_own_kv_group() -> None:
    """With 4 query heads on 2 kv heads, heads 0-1 read kv head 0 and heads 2-3 kv head 1: changing kv
    head 1's values moves only the outputs of query heads 2 and 3."""
    h, g, d = 4, 2, 3
    qkv = _packed(1, 5, h, g, d)
    module = Attention(h, d, g)
    before = module(qkv)
    changed = qkv.clone()
    v1 = (h + g) * d + d  # value head 1 starts here
    changed[..., v1 : v1 + d] += 1.0
    after = module(changed)
    torch.testing.assert_close(after[..., : 2 * d], before[..., : 2 * d], rtol=0, atol=0)
    assert not torch.allclose(after[..., 2 * d :], before[..., 2 * d :])


def test_rotary_scores_depend_on_relative_position_only() -> None:
    """RoPE's defining property, on the independent rotation: q rotated at p and k rotated at p + r give
    the same dot product for every p."""
    generator = torch.Generator().manual_seed(3)
    q, k = (
        torch.randn(8, generator=generator, dtype=torch.float64),
        torch.randn(8, generator=generator, dtype=torch.float64),
    )
    dots = [(rotate_pairs(q, p, 10000.0) * rotate_pairs(k, p + 3, 10000.0)).sum() for p in range(5)]
    torch.testing.assert_close(torch.stack(dots), dots[0].expand(5), rtol=1e-12, atol=1e-12)
    # ...and the module rotates the same way: a single position pair through the module's tables.
    module = Attention(1, 8, 1, rotary=True, causal=False)
    qkv = torch.zeros(1, 4, 24, dtype=torch.float64)
    qkv[0, :, :8], qkv[0, :, 8:16] = q, k
    rotated_q, rotated_k, _ = module.split_heads(qkv)
    for p in range(4):
        torch.testing.assert_close(
            rotated_q[0, p, 0], rotate_pairs(q, p, 10000.0, True), rtol=1e-12, atol=1e-12
        )
        torch.testing.assert_close(
            rotated_k[0, p, 0], rotate_pairs(k, p, 10000.0, True), rtol=1e-12, atol=1e-12
        )


def test_bfloat16_rounds_once_from_a_float32_computation() -> None:
    qkv = _packed(2, 6, 4, 2, 8).to(torch.bfloat16)
    module = Attention(4, 8, 2, rotary=True)
    got = module(qkv)
    assert got.dtype == torch.bfloat16
    want = naive_attention(qkv.double(), 4, 2, 8, rotary=True)
    # one rounding of a float32 result: within bfloat16's half-ulp of each value (plus float32 noise)
    assert ((got.double() - want).abs() <= want.abs() * 2**-8 + 1e-6).all()


def test_softmax_scale_is_one_over_sqrt_head_dim() -> None:
    """Two positions, one head, causal off: position 0's output weighs v0 and v1 by the softmax of
    q.k / sqrt(d), computed by hand."""
    d = 4
    q = torch.tensor([1.0, 0.0, 2.0, 0.0], dtype=torch.float64)
    k0, k1 = torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([0.0, 0.0, 1.0, 3.0])
    v0, v1 = torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.tensor([0.0, 0.0, 0.0, 1.0])
    qkv = torch.zeros(1, 2, 3 * d, dtype=torch.float64)
    qkv[0, 0] = torch.cat([q, k0.double(), v0.double()])
    qkv[0, 1] = torch.cat([q, k1.double(), v1.double()])
    out = Attention(1, d, causal=False)(qkv)
    s0, s1 = 1.0 / math.sqrt(d), 2.0 / math.sqrt(d)
    w1 = math.exp(s1) / (math.exp(s0) + math.exp(s1))
    torch.testing.assert_close(out[0, 0], torch.tensor([1 - w1, 0.0, 0.0, w1], dtype=torch.float64))


def test_bad_shapes_and_arguments_are_refused() -> None:
    module = Attention(4, 8, 2)
    with pytest.raises(ValueError, match=r"takes \[batch, seq, 64\]"):
        module(torch.randn(10, 64))
    with pytest.raises(ValueError, match=r"takes \[batch, seq, 64\]"):
        module(torch.randn(2, 10, 63))
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        Attention(4, 8, 3)
    with pytest.raises(ValueError, match="must be even"):
        Attention(4, 5, 2, rotary=True)
