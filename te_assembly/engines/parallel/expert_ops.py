"""Expert-parallel Dispatch and Combine: the catalog's MoE ops with their rows exchanged between ranks.

Each of the ``P`` ranks of the expert group holds ``L = E / P`` consecutive experts (rank q: experts
``q*L .. q*L+L-1``) and its own tokens. The wrapped single-process Dispatch groups this rank's token
copies by expert (all ``E`` of them, padded as it pads), so the rows for rank q form one contiguous
block; ``all_to_all_single`` sends each block to its rank. Rows arrive ordered by source rank, then
expert; they are regrouped by expert, then source rank, so the local GroupedLinears see ``L`` groups
whose sizes (``split_sizes``) count every rank's rows. Combine undoes both steps and hands the wrapped
Combine this rank's rows in the order its own Dispatch produced them. Gradients return along the same
routes (``collectives.exchange_rows``).

Which Dispatch outputs travel with the rows, which count the local experts and which stay with the
tokens is the catalog's sharding entry (``catalog/sharding.py``), not code here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from te_assembly.catalog.sharding import Sharding
from te_assembly.engines.parallel.collectives import all_to_all, exchange_rows
from te_assembly.engines.parallel.mesh import Group, group_size
from te_assembly.engines.reference.ops.base import ReferenceOp

Out = tuple[torch.Tensor, tuple[torch.Tensor, ...]]


@dataclass(frozen=True)
class Route:
    """How one forward's rows travelled: what Combine needs to send them back."""

    send: list[int]
    """Rows sent to each rank (``in_splits`` of the outbound all-to-all)."""
    receive: list[int]
    """Rows received from each rank."""
    order: torch.Tensor
    """Received rows (by source rank, then expert) -> local order (by expert, then source rank)."""


class ExpertExchange:
    """Shared by one Dispatch and the Combine that reads its row map: the route of the current forward.

    A slot, not a queue: a forward that failed half-way leaves nothing a later forward could pick up."""

    def __init__(self) -> None:
        self.route: Route | None = None

    def put(self, route: Route) -> None:
        self.route = route

    def take(self) -> Route:
        if self.route is None:
            raise RuntimeError("expert-parallel Combine ran without its Dispatch in the same forward")
        route, self.route = self.route, None
        return route


def regroup_order(counts: torch.Tensor) -> torch.Tensor:
    """``counts[q, e]`` rows from rank q for local expert e arrive as blocks in (q, e) order; the index
    that lists them in (e, q) order instead."""
    sources, experts = counts.shape
    flat = counts.reshape(-1)
    starts = torch.cumsum(flat, 0) - flat  # start of block (q, e) in arrival order
    by_expert = starts.view(sources, experts).t().reshape(-1)
    sizes = counts.t().reshape(-1)
    if int(sizes.sum()) == 0:
        return torch.zeros(0, dtype=torch.int64, device=counts.device)
    block = torch.repeat_interleave(torch.arange(sizes.numel(), device=counts.device), sizes)
    within = torch.arange(block.numel(), device=counts.device) - (torch.cumsum(sizes, 0) - sizes)[block]
    return by_expert[block] + within


class ExpertParallelDispatch(ReferenceOp):
    """The wrapped Dispatch, then this rank's rows sent to their experts' ranks (module doc)."""

    def __init__(
        self,
        dispatch: ReferenceOp,
        *,
        num_experts: int,
        output_slots: Sequence[str],
        sharding: Sharding,
        group: Group,
        exchange: ExpertExchange,
    ) -> None:
        super().__init__()
        self.local = dispatch
        self.num_experts = num_experts
        self.group, self.exchange = group, exchange
        self.ranks = group_size(group)
        self.local_experts = num_experts // self.ranks
        self.slots = tuple(output_slots)
        self.sharding = sharding

    def forward(self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()) -> Out:  # type: ignore[override]
        rows, extras = self.local(x, extra_inputs)
        outputs = dict(zip(self.slots, extras, strict=True))
        counts_slot = self.sharding.group_counts
        assert counts_slot is not None
        counts = outputs[counts_slot].reshape(self.ranks, self.local_experts).to(torch.int64)
        # Every rank learns how many rows of each of its experts every other rank sends.
        received = all_to_all(
            counts.reshape(-1).contiguous(),
            [self.local_experts] * self.ranks,
            [self.local_experts] * self.ranks,
            self.group,
        ).view(self.ranks, self.local_experts)
        route = Route(
            counts.sum(1).tolist(),
            received.sum(1).tolist(),
            regroup_order(received.to(rows.device)),
        )
        self.exchange.put(route)
        moved = {name: self._move(outputs[name], route) for name in self.sharding.exchanged}
        local_counts = received.sum(0).to(
            device=outputs[counts_slot].device, dtype=outputs[counts_slot].dtype
        )
        result = []
        for name in self.slots:
            if name == counts_slot:
                result.append(local_counts)
            elif name in moved:
                result.append(moved[name])
            else:
                result.append(outputs[name])  # stays with the tokens (the row map Combine reads)
        return self._move(rows, route), tuple(result)

    def _move(self, t: torch.Tensor, route: Route) -> torch.Tensor:
        arrived = exchange_rows(t, route.receive, route.send, self.group)
        return arrived.index_select(0, route.order)


class ExpertParallelCombine(ReferenceOp):
    """Rows sent back to the ranks their tokens live on, then the wrapped Combine (module doc)."""

    def __init__(self, combine: ReferenceOp, *, group: Group, exchange: ExpertExchange) -> None:
        super().__init__()
        self.local = combine
        self.group, self.exchange = group, exchange

    def forward(self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()) -> Out:  # type: ignore[override]
        route = self.exchange.take()
        # ``order`` is a permutation: scattering through it restores arrival order exactly.
        arrival = torch.empty_like(route.order)
        arrival[route.order] = torch.arange(route.order.numel(), device=route.order.device)
        back = exchange_rows(x.index_select(0, arrival), route.send, route.receive, self.group)
        return self.local(back, extra_inputs)


__all__ = ["ExpertExchange", "ExpertParallelCombine", "ExpertParallelDispatch", "Route", "regroup_order"]
