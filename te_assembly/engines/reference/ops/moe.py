"""Mixture-of-experts reference ops: TopKRouter, Dispatch and Combine (TE ships none of these)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from te_assembly.engines.reference.ops.base import ReferenceOp
from te_assembly.engines.reference.ops.linear import init_weight

Out = tuple[torch.Tensor, tuple[torch.Tensor, ...]]


def expert_counts(routing_map: torch.Tensor, num_experts: int) -> torch.Tensor:
    """int64 [num_experts] token-slots per expert; a comparison sum is deterministic on CUDA, unlike
    bincount/scatter_add under torch.use_deterministic_algorithms."""
    experts = torch.arange(num_experts, device=routing_map.device)
    return (routing_map.reshape(-1, 1) == experts).sum(dim=0, dtype=torch.int64)


def _score_dtype(dtype: torch.dtype) -> torch.dtype:
    # Routing decisions in bf16 flip on ties too easily; score in at least float32.
    return torch.promote_types(dtype, torch.float32)


class TopKRouter(ReferenceOp):
    """Scores tokens against experts and keeps the top k; x passes through unchanged.

    The knobs are those of TE's fused router (``transformer_engine.pytorch.router``):

    - ``softmax``: with ``pre_softmax`` the kept probabilities are the softmax over all experts
      (Qwen's ``norm_topk_prob=false``); without, they are renormalised over the k kept (TE's default,
      Mixtral's and Qwen's ``norm_topk_prob=true``: the softmax of the k largest logits);
    - ``sigmoid``: independent scores, renormalised over the k kept when k > 1 (DeepSeek-V3);
    - ``enable_expert_bias``: a per-expert bias (buffer ``expert_bias``) added to the scores to choose the
      experts only, never to the probabilities (DeepSeek-V3's ``e_score_correction_bias``);
    - ``num_groups``/``group_topk``: the experts are cut into ``num_groups`` equal groups, each scored
      by the sum of its ``top_k // group_topk`` best scores, and only the ``group_topk`` best groups
      compete (group-limited routing);
    - ``scaling_factor``: multiplies the kept probabilities (DeepSeek's ``routed_scaling_factor``);
    - ``bias``: a learned bias on the logits (GPT-OSS), part of the scores.
    """

    def __init__(
        self,
        in_features: int,
        num_experts: int,
        top_k: int,
        score_function: str = "softmax",
        aux_loss_coeff: float = 0.01,
        pre_softmax: bool = False,
        scaling_factor: float | None = None,
        enable_expert_bias: bool = False,
        num_groups: int | None = None,
        group_topk: int | None = None,
        group_score_topk: int | None = None,
        sigmoid_renormalise: bool = True,
        bias: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ValueError(
                f"TopKRouter needs 0 < top_k <= num_experts, got top_k={top_k}, num_experts={num_experts}"
            )
        if score_function not in ("softmax", "sigmoid"):
            raise ValueError(f"TopKRouter score_function must be softmax or sigmoid, got {score_function!r}")
        if (num_groups is None) != (group_topk is None):
            raise ValueError("TopKRouter takes num_groups and group_topk together (group-limited routing)")
        if num_groups is not None and group_topk is not None:
            uneven = top_k % group_topk and group_score_topk is None
            if num_experts % num_groups or not 0 < group_topk <= num_groups or uneven:
                raise ValueError(
                    f"TopKRouter group-limited routing needs num_experts a multiple of num_groups, "
                    f"0 < group_topk <= num_groups and top_k a multiple of group_topk; got num_experts="
                    f"{num_experts}, num_groups={num_groups}, group_topk={group_topk}, top_k={top_k}"
                )
        self.in_features = in_features
        self.num_experts = num_experts
        self.top_k = top_k
        self.score_function = score_function
        self.aux_loss_coeff = aux_loss_coeff
        self.pre_softmax = pre_softmax
        self.scaling_factor = scaling_factor
        self.num_groups = num_groups
        self.group_topk = group_topk
        self.group_score_topk = group_score_topk
        self.sigmoid_renormalise = sigmoid_renormalise
        self.weight = init_weight(num_experts, in_features, device, dtype)
        if bias:  # only then an attribute: ``bias`` the argument names the parameter's presence
            self.bias = torch.nn.Parameter(torch.zeros(num_experts, device=device, dtype=dtype))
        self.enable_expert_bias = enable_expert_bias
        if enable_expert_bias:
            self.register_buffer("expert_bias", torch.zeros(num_experts, device=device, dtype=dtype))
        else:
            self.expert_bias: torch.Tensor | None = None

    def _scores(self, tokens: torch.Tensor) -> torch.Tensor:
        dtype = _score_dtype(tokens.dtype)
        given = self._parameters.get("bias")
        bias = None if given is None else given.to(dtype)
        logits = torch.nn.functional.linear(tokens.to(dtype), self.weight.to(dtype), bias)
        if self.score_function == "softmax":
            return torch.softmax(logits, dim=-1)
        return torch.sigmoid(logits)

    def _choose(self, scores: torch.Tensor) -> torch.Tensor:
        """The ``top_k`` expert ids of each token: biased scores, group-limited when asked."""
        choice = scores if self.expert_bias is None else scores + self.expert_bias.to(scores.dtype)
        if self.num_groups is not None and self.group_topk is not None:
            grouped = choice.view(choice.shape[0], self.num_groups, -1)
            scored = self.group_score_topk or self.top_k // self.group_topk
            group_scores = grouped.topk(scored, dim=-1).values.sum(dim=-1)
            best = group_scores.topk(self.group_topk, dim=-1).indices
            keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
            choice = choice.masked_fill(~keep.repeat_interleave(grouped.shape[-1], dim=1), float("-inf"))
        return torch.topk(choice, self.top_k, dim=-1).indices

    def _aux_loss(self, scores: torch.Tensor, routing_map: torch.Tensor) -> torch.Tensor:
        # Switch-transformer balance loss; sigmoid scores are normalised so P is a distribution too.
        if self.score_function == "sigmoid":
            scores = scores / scores.sum(dim=-1, keepdim=True)
        fraction = expert_counts(routing_map, self.num_experts).to(scores.dtype) / max(routing_map.numel(), 1)
        mean_score = scores.mean(dim=0) if scores.shape[0] else scores.sum(dim=0)
        return self.aux_loss_coeff * self.num_experts * (fraction * mean_score).sum()

    def forward(self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()) -> Out:  # type: ignore[override]
        scores = self._scores(x.reshape(-1, self.in_features))
        routing_map = self._choose(scores)
        probs = scores.gather(1, routing_map)
        if self.score_function == "softmax" and not self.pre_softmax:
            probs = probs / probs.sum(dim=-1, keepdim=True)
        elif self.score_function == "sigmoid" and self.top_k > 1 and self.sigmoid_renormalise:
            probs = probs / (probs.sum(dim=-1, keepdim=True) + 1e-20)
        if self.scaling_factor is not None:
            probs = probs * self.scaling_factor
        return x, (probs, routing_map, self._aux_loss(scores, routing_map))


class Dispatch(ReferenceOp):
    """Copies each token top_k times and sorts the copies by expert (stable: token, then slot order).

    With ``align > 1`` every expert's group is padded at its end to a multiple of ``align`` rows: the
    padding rows are zeros, their probability is 0 and their ``row_map`` entry is -1, so Combine drops
    them and no gradient reaches or leaves them. Quantized grouped GEMMs need aligned groups (TE pads
    them the same way: ``transformer_engine/pytorch/module/fp8_padding.py``)."""

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        align: int = 1,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if align < 1:
            raise ValueError(f"Dispatch align must be a positive integer, got {align}")
        self.num_experts = num_experts
        self.top_k = top_k
        self.align = align

    def _check(self, tokens: int, probs: torch.Tensor, routing_map: torch.Tensor) -> None:
        expected = (tokens, self.top_k)
        if tuple(probs.shape) != expected or tuple(routing_map.shape) != expected:
            raise ValueError(
                f"Dispatch expects probs and routing_map of shape {expected}, got "
                f"{tuple(probs.shape)} and {tuple(routing_map.shape)}"
            )
        if routing_map.numel() and not bool(((routing_map >= 0) & (routing_map < self.num_experts)).all()):
            raise ValueError(f"Dispatch routing_map has expert ids outside [0, {self.num_experts})")

    def forward(self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()) -> Out:  # type: ignore[override]
        probs, routing_map = extra_inputs[0], extra_inputs[1]
        tokens = x.reshape(-1, x.shape[-1])
        self._check(tokens.shape[0], probs, routing_map)
        flat_map = routing_map.reshape(-1)
        counts = expert_counts(flat_map, self.num_experts)
        # Flat slot index t*k+j already orders by token then slot, so a stable sort keeps that order.
        row_map = torch.sort(flat_map, stable=True).indices
        rows = tokens.index_select(0, torch.div(row_map, self.top_k, rounding_mode="floor"))
        row_probs = probs.reshape(-1).index_select(0, row_map)
        if self.align == 1:
            return rows, (counts, row_probs, row_map)
        padded = aligned_counts(counts, self.align)
        slots = _padded_positions(flat_map.index_select(0, row_map), counts, padded)
        total = int(padded.sum())
        # index_copy's gradient for its source is a gather at the same positions: the padding rows
        # receive none and send none, and no two rows share a position (deterministic on CUDA too).
        rows = tokens.new_zeros(total, tokens.shape[1]).index_copy(0, slots, rows)
        row_probs = row_probs.new_zeros(total).index_copy(0, slots, row_probs)
        row_map = row_map.new_full((total,), -1).index_copy(0, slots, row_map)
        return rows, (padded, row_probs, row_map)


def aligned_counts(counts: torch.Tensor, align: int) -> torch.Tensor:
    """Each count rounded up to a multiple of ``align`` (an empty group stays empty)."""
    return torch.div(counts + (align - 1), align, rounding_mode="floor") * align


def _padded_positions(experts: torch.Tensor, counts: torch.Tensor, padded: torch.Tensor) -> torch.Tensor:
    """Where each expert-sorted row goes in the padded layout: its group's padded start plus its rank
    within the group."""
    real_starts = torch.cumsum(counts, 0) - counts
    padded_starts = torch.cumsum(padded, 0) - padded
    rank = torch.arange(experts.numel(), device=experts.device) - real_starts.index_select(0, experts)
    return padded_starts.index_select(0, experts) + rank


class Combine(ReferenceOp):
    """Undoes Dispatch's permutation and sums each token's top_k rows (probabilities are not applied).
    Rows whose ``row_map`` entry is negative are Dispatch's alignment padding and are dropped."""

    def __init__(
        self, top_k: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> None:
        super().__init__()
        self.top_k = top_k

    def forward(self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()) -> Out:  # type: ignore[override]
        row_map = extra_inputs[0].reshape(-1)
        if x.shape[0] != row_map.numel():
            raise ValueError(
                f"Combine expects {row_map.numel()} rows (one per row_map entry), got {x.shape[0]}"
            )
        positions = torch.nonzero(row_map >= 0).reshape(-1)
        sources = row_map.index_select(0, positions)
        if sources.numel() % self.top_k:
            raise ValueError(
                f"Combine expects a multiple of top_k={self.top_k} rows besides padding, "
                f"got {sources.numel()}"
            )
        # Gather through the inverse permutation. index_select's backward is an index_add_ (a scatter-add),
        # but ``inverse`` is a permutation: each row receives exactly one gradient row, so no two adds
        # collide and the result does not depend on their order. Padding rows are never gathered.
        inverse = torch.empty_like(sources)
        inverse[sources] = positions
        slots = x.index_select(0, inverse)
        return slots.view(-1, self.top_k, *x.shape[1:]).sum(dim=1), ()
