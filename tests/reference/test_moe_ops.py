"""MoE reference ops: routing, dispatch/combine permutation, gradients and edge cases."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from te_assembly.engines.reference.ops.linear import GroupedLinear
from te_assembly.engines.reference.ops.moe import Combine, Dispatch, TopKRouter

F64 = torch.float64


def _route(routing: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, probs, routing_map for a hand-written routing; x row t is filled with t so rows are traceable."""
    routing_map = torch.tensor(routing, dtype=torch.int64)
    tokens, top_k = routing_map.shape
    x = torch.arange(tokens, dtype=F64)[:, None].repeat(1, 3) + torch.rand(tokens, 3, dtype=F64) * 0.1
    probs = torch.rand(tokens, top_k, dtype=F64) + 0.1
    return x, probs / probs.sum(-1, keepdim=True), routing_map


def _router(score_function: str, num_experts: int = 4, top_k: int = 2) -> TopKRouter:
    torch.manual_seed(0)
    return TopKRouter(
        in_features=3, num_experts=num_experts, top_k=top_k, score_function=score_function, dtype=F64
    )


@pytest.mark.parametrize("score_function", ["softmax", "sigmoid"])
def test_router_outputs(score_function: str) -> None:
    router = _router(score_function)
    x = torch.randn(2, 5, 3, dtype=F64)
    y, (probs, routing_map, aux) = router(x)
    assert y is x
    assert probs.shape == (10, 2) and routing_map.dtype == torch.int64 and not routing_map.requires_grad
    logits = x.reshape(10, 3) @ router.weight.detach().T
    scores = logits.softmax(-1) if score_function == "softmax" else logits.sigmoid()
    assert torch.equal(routing_map, scores.topk(2, dim=-1).indices)
    top = scores.gather(-1, routing_map)
    torch.testing.assert_close(probs.detach(), top / top.sum(-1, keepdim=True))  # by value, not just sums
    dist = scores / scores.sum(-1, keepdim=True)
    fraction = torch.stack([(routing_map == e).sum() for e in range(4)]).to(F64) / 20
    torch.testing.assert_close(aux.detach(), 0.01 * 4 * (fraction * dist.mean(0)).sum())


LOGITS = [[2.0, 1.0, 0.5, -1.0], [0.0, 3.0, 3.5, 1.0], [-0.5, 0.25, -2.0, 0.75]]
"""Hand-picked logits (the router's weight is set to the identity, so logits == x)."""


def _by_hand(
    score_function: str, top_k: int, coeff: float
) -> tuple[list[list[int]], list[list[float]], float]:
    """routing_map, probs and aux_loss in plain Python floats: score, keep the top_k highest (best first),
    renormalise (a sigmoid score only when top_k > 1, as TE's fused router does); aux = coeff * E *
    sum_e f_e * P_e (f_e: share of the T*k slots routed to e; P_e: mean over tokens of the scores,
    sigmoid scores first divided by their row sum)."""
    experts, tokens = len(LOGITS[0]), len(LOGITS)
    if score_function == "softmax":
        scores = [[math.exp(z) / sum(math.exp(v) for v in row) for z in row] for row in LOGITS]
        dist = scores
    else:
        scores = [[1 / (1 + math.exp(-z)) for z in row] for row in LOGITS]
        dist = [[s / sum(row) for s in row] for row in scores]
    chosen = [sorted(range(experts), key=lambda e, row=row: -row[e])[:top_k] for row in scores]
    probs = []
    for row, picks in zip(scores, chosen, strict=True):
        if score_function == "sigmoid" and top_k == 1:
            probs.append([row[e] for e in picks])
        else:
            probs.append([row[e] / sum(row[c] for c in picks) for e in picks])
    share = [sum(picks.count(e) for picks in chosen) / (tokens * top_k) for e in range(experts)]
    mean_score = [sum(row[e] for row in dist) / tokens for e in range(experts)]
    aux = coeff * experts * sum(f * p for f, p in zip(share, mean_score, strict=True))
    return chosen, probs, aux


@pytest.mark.parametrize("score_function", ["softmax", "sigmoid"])
@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_router_probabilities_and_aux_loss_by_hand(score_function: str, top_k: int) -> None:
    router = TopKRouter(4, 4, top_k, score_function=score_function, aux_loss_coeff=0.05, dtype=F64)
    with torch.no_grad():
        router.weight.copy_(torch.eye(4, dtype=F64))
    _, (probs, routing_map, aux) = router(torch.tensor(LOGITS, dtype=F64))
    chosen, want_probs, want_aux = _by_hand(score_function, top_k, 0.05)
    assert routing_map.tolist() == chosen
    torch.testing.assert_close(probs, torch.tensor(want_probs, dtype=F64), rtol=1e-12, atol=0)
    assert aux.item() == pytest.approx(want_aux, rel=1e-12)


@pytest.mark.parametrize("score_function", ["softmax", "sigmoid"])
def test_router_gradcheck(score_function: str) -> None:
    router = _router(score_function)
    x = torch.randn(6, 3, dtype=F64, requires_grad=True)
    weight = router.weight.detach().clone().requires_grad_(True)
    scores = torch.nn.functional.linear(x.detach(), weight.detach()).softmax(-1)
    gaps = scores.sort(-1, descending=True).values.diff(dim=-1).abs()
    assert gaps.min() > 1e-3, "pick a seed without near-ties so the top-k choice is stable under gradcheck"

    def run(x_: torch.Tensor, w_: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y, (probs, _, aux) = torch.func.functional_call(router, {"weight": w_}, (x_,))
        return y * 1.0, probs, aux

    # gradcheck skips outputs that do not require grad: a detached probs or aux_loss would pass it.
    assert all(out.requires_grad for out in run(x, weight))
    assert torch.autograd.gradcheck(run, (x, weight))


def test_router_gradient_to_x_includes_the_logits_path() -> None:
    router = _router("softmax")
    x = torch.randn(4, 3, dtype=F64, requires_grad=True)
    _, (probs, _, aux) = router(x)
    (probs[:, 0].sum() + aux).backward()
    assert x.grad is not None and torch.count_nonzero(x.grad) > 0


def test_router_top_k_equals_num_experts() -> None:
    _, (probs, routing_map, _) = _router("softmax", num_experts=3, top_k=3)(torch.randn(5, 3, dtype=F64))
    torch.testing.assert_close(probs.sum(-1), torch.ones(5, dtype=F64))
    assert torch.equal(routing_map.sort(-1).values, torch.arange(3).expand(5, 3))


@pytest.mark.parametrize("top_k", [0, 3])
def test_router_rejects_top_k_outside_1_to_num_experts(top_k: int) -> None:
    with pytest.raises(ValueError, match=rf"0 < top_k <= num_experts, got top_k={top_k}, num_experts=2"):
        TopKRouter(in_features=3, num_experts=2, top_k=top_k)
    with pytest.raises(ValueError, match="score_function must be softmax or sigmoid, got 'relu'"):
        TopKRouter(in_features=3, num_experts=2, top_k=1, score_function="relu")


@pytest.mark.parametrize("score_function", ["softmax", "sigmoid"])
def test_router_on_no_tokens(score_function: str) -> None:
    router = _router(score_function)
    x = torch.zeros(0, 3, dtype=F64, requires_grad=True)
    _, (probs, routing_map, aux) = router(x)
    assert probs.shape == routing_map.shape == (0, 2)
    assert aux.item() == 0.0  # not NaN: no token, no imbalance
    aux.backward()
    assert router.weight.grad is not None and not router.weight.grad.any()


def test_router_aux_loss_of_one_token_with_top_1() -> None:
    router = TopKRouter(2, 2, 1, aux_loss_coeff=1.0, dtype=F64)
    with torch.no_grad():
        router.weight.copy_(torch.eye(2, dtype=F64))
    _, (probs, routing_map, aux) = router(torch.tensor([[1.0, 0.0]], dtype=F64))
    p0 = math.exp(1) / (math.exp(1) + 1)
    assert routing_map.tolist() == [[0]] and probs.tolist() == [[1.0]]
    assert aux.item() == pytest.approx(2 * p0, rel=1e-12)  # E * f_0 * P_0 = 2 * 1 * p0


def test_router_scores_bfloat16_tokens_in_float32() -> None:
    router = TopKRouter(3, 4, 2, dtype=torch.bfloat16)
    _, (probs, _, aux) = router(torch.randn(5, 3, dtype=torch.bfloat16))
    assert probs.dtype == aux.dtype == torch.float32


def test_dispatch_groups_rows_by_expert_in_token_order() -> None:
    routing = [[2, 0], [0, 3], [2, 3], [0, 2]]  # expert 1 gets no tokens
    x, probs, routing_map = _route(routing)
    rows, (split_sizes, row_probs, row_map) = Dispatch(num_experts=4, top_k=2)(x, (probs, routing_map))
    assert split_sizes.tolist() == [3, 0, 3, 2] and split_sizes.dtype == torch.int64
    expected_sources = [t * 2 + j for e in range(4) for t in range(4) for j in range(2) if routing[t][j] == e]
    assert row_map.tolist() == expected_sources
    torch.testing.assert_close(rows, x[torch.tensor(expected_sources) // 2])
    torch.testing.assert_close(row_probs, probs.reshape(-1)[torch.tensor(expected_sources)])
    assert not split_sizes.requires_grad and not row_map.requires_grad


@pytest.mark.parametrize(
    ("routing", "num_experts"),
    [
        ([[2, 0], [0, 3], [2, 3]], 4),  # expert 1 empty
        ([[1, 1], [1, 1], [1, 1]], 4),  # every slot to one expert
        ([[0, 1, 2], [2, 1, 0], [1, 0, 2]], 3),  # top_k == num_experts
    ],
)
def test_dispatch_then_combine_with_unit_probs_is_top_k_times_x(
    routing: list[list[int]], num_experts: int
) -> None:
    x, _, routing_map = _route(routing)
    top_k = routing_map.shape[1]
    unit_probs = torch.ones(routing_map.shape, dtype=F64)
    rows, (split_sizes, _, row_map) = Dispatch(num_experts, top_k)(x, (unit_probs, routing_map))
    assert split_sizes.tolist() == [sum(row.count(e) for row in routing) for e in range(num_experts)]
    y, extra = Combine(top_k)(rows, (row_map,))
    assert extra == ()
    torch.testing.assert_close(y, top_k * x, rtol=0, atol=0)


def test_all_tokens_to_one_expert_through_grouped_linear() -> None:
    x, probs, routing_map = _route([[1], [1], [1]])
    rows, (split_sizes, _, row_map) = Dispatch(num_experts=3, top_k=1)(x, (probs, routing_map))
    assert split_sizes.tolist() == [0, 3, 0]
    experts = GroupedLinear(num_groups=3, in_features=3, out_features=3, dtype=F64)
    out, _ = experts(rows, (split_sizes,))
    y, _ = Combine(top_k=1)(out, (row_map,))
    y.sum().backward()
    torch.testing.assert_close(y, x @ experts.get_parameter("weight1").detach().T)
    empty_grad = experts.get_parameter("weight0").grad
    assert empty_grad is not None and torch.count_nonzero(empty_grad) == 0


def test_dispatch_combine_gradcheck() -> None:
    x, probs, routing_map = _route([[2, 0], [0, 3], [2, 3], [1, 2]])
    x.requires_grad_(True)
    probs.requires_grad_(True)
    dispatch, combine = Dispatch(num_experts=4, top_k=2), Combine(top_k=2)

    def run_dispatch(x_: torch.Tensor, p_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows, (_, row_probs, _) = dispatch(x_, (p_, routing_map))
        return rows, row_probs

    # gradcheck skips outputs that do not require grad: a detached row_probs would pass it.
    assert all(out.requires_grad for out in run_dispatch(x, probs))
    assert torch.autograd.gradcheck(run_dispatch, (x, probs))
    _, (_, _, row_map) = dispatch(x.detach(), (probs.detach(), routing_map))
    rows = torch.randn(8, 3, dtype=F64, requires_grad=True)
    assert combine(rows, (row_map,))[0].requires_grad
    assert torch.autograd.gradcheck(lambda r: combine(r, (row_map,))[0], (rows,))


def test_dispatch_rejects_bad_routing() -> None:
    x, probs, routing_map = _route([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match=r"expert ids outside \[0, 2\)"):
        Dispatch(num_experts=2, top_k=2)(x, (probs, routing_map + 1))
    shapes = r"expects probs and routing_map of shape \(2, 1\), got \(2, 2\) and \(2, 2\)"
    with pytest.raises(ValueError, match=shapes):
        Dispatch(num_experts=2, top_k=1)(x, (probs, routing_map))
    # Either tensor alone with the wrong shape is refused too.
    with pytest.raises(ValueError, match=r"got \(2, 1\) and \(2, 2\)"):
        Dispatch(num_experts=2, top_k=2)(x, (probs[:, :1], routing_map))
    with pytest.raises(ValueError, match=r"got \(2, 2\) and \(2, 1\)"):
        Dispatch(num_experts=2, top_k=2)(x, (probs, routing_map[:, :1]))


@pytest.mark.parametrize("rows", [6, 7])
def test_combine_rejects_rows_that_do_not_match_the_row_map(rows: int) -> None:
    """6 rows for an 8-row map is a multiple of top_k and still wrong; 7 is neither."""
    with pytest.raises(ValueError, match=rf"Combine expects 8 rows\b.*got {rows}"):
        Combine(top_k=2)(torch.randn(rows, 3), (torch.randperm(8),))


def test_dispatch_order_is_stable_for_many_tied_slots() -> None:
    """Copies of one expert keep token-then-slot order however many tie. torch's CPU sort without
    stable=True reorders ties at this size (checked on torch 2.14), so a 4-token example cannot tell."""
    gen = torch.Generator().manual_seed(0)
    tokens, top_k, experts = 500, 2, 4
    routing_map = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
    x = torch.arange(tokens, dtype=F64)[:, None]
    probs = torch.full((tokens, top_k), 0.5, dtype=F64)
    rows, (_, _, row_map) = Dispatch(experts, top_k)(x, (probs, routing_map))
    flat = routing_map.reshape(-1).tolist()
    want = sorted(range(tokens * top_k), key=lambda i: (flat[i], i))
    assert row_map.tolist() == want
    assert rows[:, 0].tolist() == [i // top_k for i in want]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_pipeline_in_low_precision(dtype: torch.dtype) -> None:
    router = TopKRouter(in_features=3, num_experts=4, top_k=2, dtype=dtype)
    x = torch.randn(5, 3, dtype=dtype, requires_grad=True)
    y, (probs, routing_map, aux) = router(x)
    rows, (split_sizes, row_probs, row_map) = Dispatch(4, 2)(y, (probs, routing_map))
    out, _ = Combine(2)(rows * row_probs[:, None].to(dtype), (row_map,))
    assert out.dtype == dtype and int(split_sizes.sum()) == 10
    (out.float().sum() + aux).backward()
    assert x.grad is not None and router.weight.grad is not None and torch.isfinite(x.grad.float()).all()


def test_dispatch_pads_each_expert_group_to_the_alignment() -> None:
    routing = [[2, 0], [0, 3], [2, 3], [0, 2]]  # counts [3, 0, 3, 2]; expert 1 gets no tokens
    x, probs, routing_map = _route(routing)
    rows, (split_sizes, row_probs, row_map) = Dispatch(num_experts=4, top_k=2, align=4)(
        x, (probs, routing_map)
    )
    assert split_sizes.tolist() == [4, 0, 4, 4]  # an empty group stays empty
    sources = [t * 2 + j for e in range(4) for t in range(4) for j in range(2) if routing[t][j] == e]
    pad = -1
    expected_map = [*sources[:3], pad, *sources[3:6], pad, *sources[6:], pad, pad]
    assert row_map.tolist() == expected_map
    real = row_map >= 0
    torch.testing.assert_close(rows[real], x[row_map[real] // 2], rtol=0, atol=0)
    torch.testing.assert_close(row_probs[real], probs.reshape(-1)[row_map[real]], rtol=0, atol=0)
    assert torch.count_nonzero(rows[~real]) == 0 and torch.count_nonzero(row_probs[~real]) == 0


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.integers(0, 12),
    num_experts=st.integers(1, 5),
    data=st.data(),
    align=st.integers(1, 9),
)
def test_padding_changes_nothing_but_the_row_count(
    tokens: int, num_experts: int, data: st.DataObject, align: int
) -> None:
    """Dispatch(align) -> a per-row expert function scaled by row_probs -> Combine equals the unpadded
    block exactly, and so do the gradients of x and of the probabilities (float64, any routing)."""
    top_k = data.draw(st.integers(1, num_experts))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    routing_map = torch.rand(tokens, num_experts, generator=gen).argsort(dim=-1)[:, :top_k]
    scale = torch.randn(3, dtype=F64, generator=gen)

    def block(a: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        x = torch.randn(tokens, 3, dtype=F64, generator=torch.Generator().manual_seed(1)).requires_grad_(True)
        probs = torch.rand(
            tokens, top_k, dtype=F64, generator=torch.Generator().manual_seed(2)
        ).requires_grad_(True)
        rows, (split_sizes, row_probs, row_map) = Dispatch(num_experts, top_k, align=a)(
            x, (probs, routing_map)
        )
        assert all(int(s) % a == 0 for s in split_sizes) and int(split_sizes.sum()) == rows.shape[0]
        y, _ = Combine(top_k)(torch.tanh(rows * scale) * row_probs[:, None], (row_map,))
        (gx, gp) = torch.autograd.grad((y * y).sum(), (x, probs), allow_unused=True)
        return (
            y,
            gx if gx is not None else torch.zeros_like(x),
            gp if gp is not None else torch.zeros_like(probs),
            split_sizes,
        )

    y1, gx1, gp1, _ = block(1)
    ya, gxa, gpa, sizes = block(align)
    assert sizes.tolist() == [-(-int((routing_map == e).sum()) // align) * align for e in range(num_experts)]
    for got, want in ((ya, y1), (gxa, gx1), (gpa, gp1)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_combine_and_dispatch_reject_bad_arguments() -> None:
    with pytest.raises(ValueError, match="align"):
        Dispatch(num_experts=2, top_k=1, align=0)
    x, probs, routing_map = _route([[0], [1], [1]])
    rows, (_, _, row_map) = Dispatch(num_experts=2, top_k=1, align=4)(x, (probs, routing_map))
    with pytest.raises(ValueError, match="one per row_map entry"):
        Combine(top_k=1)(rows[:-1], (row_map,))
    with pytest.raises(ValueError, match="multiple of top_k=2"):
        Combine(top_k=2)(rows, (row_map,))


def test_expert_bias_chooses_but_never_weighs() -> None:
    """DeepSeek-V3's correction bias: it moves which experts are chosen, not their probabilities."""
    router = TopKRouter(
        4, num_experts=4, top_k=2, score_function="sigmoid", enable_expert_bias=True, dtype=F64
    )
    assert "expert_bias" in dict(router.named_buffers()) and "expert_bias" not in dict(
        router.named_parameters()
    )
    with torch.no_grad():
        router.weight.copy_(torch.eye(4, dtype=F64))
        router.expert_bias.copy_(torch.tensor([0.0, 0.0, 0.0, 10.0], dtype=F64))
    x = torch.tensor(LOGITS, dtype=F64)
    _, (probs, routing_map, _) = router(x)
    assert all(3 in row for row in routing_map.tolist())
    scores = torch.sigmoid(x)
    picked = scores.gather(1, routing_map)
    torch.testing.assert_close(probs, picked / picked.sum(-1, keepdim=True), rtol=1e-12, atol=0)


def test_group_limited_routing_keeps_the_best_groups() -> None:
    """8 experts in 4 groups of 2; each group scored by its top_k / group_topk = 2 best scores; only
    the 2 best groups compete, written out by hand."""
    generator = torch.Generator().manual_seed(5)
    router = TopKRouter(
        8,
        num_experts=8,
        top_k=4,
        score_function="sigmoid",
        num_groups=4,
        group_topk=2,
        scaling_factor=2.5,
        dtype=F64,
    )
    with torch.no_grad():
        router.weight.copy_(torch.eye(8, dtype=F64))
    x = torch.randn(16, 8, generator=generator, dtype=F64) * 3
    _, (probs, routing_map, _) = router(x)
    scores = torch.sigmoid(x)
    for t in range(16):
        row = scores[t].tolist()
        group_score = [
            sorted(row[2 * k : 2 * k + 2], reverse=True)[0] + sorted(row[2 * k : 2 * k + 2])[0]
            for k in range(4)
        ]
        best = sorted(range(4), key=lambda k: -group_score[k])[:2]
        allowed = [e for k in best for e in (2 * k, 2 * k + 1)]
        want = sorted(allowed, key=lambda e: -row[e])[:4]
        assert routing_map[t].tolist() == want
        kept = [row[e] for e in want]
        torch.testing.assert_close(probs[t], torch.tensor([2.5 * v / sum(kept) for v in kept], dtype=F64))


def test_group_scores_of_two_experts_as_transformers_deepseek_and_glm_take_them() -> None:
    """``group_score_topk=2``: each group is scored by its 2 best (bias-corrected) scores whatever top_k is,
    as transformers' DeepSeek-V3 and GLM-4.5 routers do, and the kept sigmoid scores are not renormalised
    (``norm_topk_prob`` false); compared with GLM-4.5's own router (float32: it scores in float32)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.glm4_moe import modeling_glm4_moe as glm

    config = transformers.Glm4MoeConfig(
        hidden_size=8,
        n_routed_experts=12,
        num_experts_per_tok=6,
        n_group=4,
        topk_group=2,
        norm_topk_prob=False,
        routed_scaling_factor=1.7,
    )
    theirs = glm.Glm4MoeTopkRouter(config)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        theirs.weight.copy_(torch.randn(12, 8, generator=generator))
        theirs.e_score_correction_bias.copy_(torch.randn(12, generator=generator) * 0.3)
    mine = TopKRouter(
        8,
        num_experts=12,
        top_k=6,
        score_function="sigmoid",
        num_groups=4,
        group_topk=2,
        group_score_topk=2,
        scaling_factor=1.7,
        enable_expert_bias=True,
        sigmoid_renormalise=False,
    )
    with torch.no_grad():
        mine.weight.copy_(theirs.weight)
        mine.expert_bias.copy_(theirs.e_score_correction_bias)
    x = torch.randn(64, 8, generator=generator)
    _, weights, indices = theirs(x)
    _, (probs, routing_map, _) = mine(x)
    order_mine, order_theirs = routing_map.sort(dim=-1), indices.sort(dim=-1)
    assert torch.equal(order_mine.values, order_theirs.values)
    torch.testing.assert_close(
        probs.gather(1, order_mine.indices), weights.gather(1, order_theirs.indices), rtol=1e-6, atol=1e-7
    )
    # the default (top_k / group_topk = 3 experts score a group) chooses otherwise for some token
    te_default = TopKRouter(
        8,
        num_experts=12,
        top_k=6,
        score_function="sigmoid",
        num_groups=4,
        group_topk=2,
        enable_expert_bias=True,
    )
    te_default.load_state_dict(mine.state_dict())
    _, (_, other_map, _) = te_default(x)
    assert not torch.equal(other_map.sort(dim=-1).values, order_theirs.values)


def test_a_deepseek_style_router_validates_and_a_bad_grouping_is_named() -> None:
    import te_assembly

    def model(**router: object) -> dict[str, object]:
        return {
            "name": "ds_router",
            "in_features": 8,
            "input_layout": "tokens",
            "ops": [
                {
                    "name": "router",
                    "op": "TopKRouter",
                    "args": {
                        "in_features": 8,
                        "num_experts": 8,
                        "top_k": 4,
                        "score_function": "sigmoid",
                        **router,
                    },
                    "extra_outputs": {
                        "probs": {"channel": "p", "public": True},
                        "routing_map": {"channel": "m", "public": True},
                    },
                }
            ],
        }

    ok = te_assembly.load(model(num_groups=4, group_topk=2, enable_expert_bias=True, scaling_factor=2.5))
    assert not [d for d in ok.diagnostics if d.is_error]
    bad = te_assembly.load(model(num_groups=3, group_topk=4))
    paths = {d.path for d in bad.diagnostics if d.is_error}
    assert {"model.ops[0].args.num_experts", "model.ops[0].args.group_topk"} <= paths
