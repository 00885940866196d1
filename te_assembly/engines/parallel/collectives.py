"""Collectives with autograd, and a timer of the time spent in them (``bench``'s communication share).

The pairs are Megatron-LM's conjugate operators, which TE's ``BasicLinear`` also implements inside its
tensor-parallel modes: a column-parallel Linear's input is copied to every rank (backward: all-reduce of
the input gradient) or, under sequence parallelism, gathered by rows (backward: reduce-scatter); a
row-parallel Linear's output is all-reduced (backward: the gradient is already whole on every rank) or
reduce-scattered by rows (backward: all-gather). Dispatched rows travel with ``all_to_all_single``, and
its backward sends the gradients back along the same routes.

torch carries the autograd of three of them: all-gather <-> reduce-scatter and ``all_to_all_single``,
as its functional collectives (``torch.distributed._functional_collectives``, what FSDP2 and
torchtitan's expert parallelism use; ``torch.distributed.nn.functional`` is deprecated for them since
torch 2.9). The two that mean "the loss is the same on every rank", copy-to-group and
reduce-from-group (an all-reduce whose backward is the identity, and the reverse), have no torch
counterpart (``torch.distributed.nn.functional.all_reduce`` differentiates a sum over ranks' losses), so
they are the two autograd Functions written here.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as _fc

from te_assembly.engines.parallel.mesh import Group, group_rank, group_size


class CommTimer:
    """Wall-clock seconds during which at least one collective was in flight, since ``reset``. Off by
    default; when on, each collective on a CUDA device is bracketed by synchronizations so the time covers
    the communication, not its launch. Overlapping collectives (DDP's buckets) count once."""

    def __init__(self) -> None:
        self.enabled = False
        self._intervals: list[tuple[float, float]] = []
        self._lock = threading.Lock()

    def reset(self) -> None:
        with self._lock:
            self._intervals = []

    def add(self, start: float, end: float) -> None:
        with self._lock:
            self._intervals.append((start, end))

    @property
    def calls(self) -> int:
        return len(self._intervals)

    @property
    def seconds(self) -> float:
        """Length of the union of the recorded intervals."""
        with self._lock:
            intervals = sorted(self._intervals)
        total, reach = 0.0, float("-inf")
        for start, end in intervals:
            if end > reach:
                total += end - max(start, reach)
                reach = end
        return total

    @contextlib.contextmanager
    def measure(self, tensor: torch.Tensor) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        cuda = tensor.is_cuda
        if cuda:
            torch.cuda.synchronize(tensor.device)
        start = time.perf_counter()
        yield
        if cuda:
            torch.cuda.synchronize(tensor.device)
        self.add(start, time.perf_counter())


TIMER = CommTimer()


# ------------------------------------------------------------------------------------ plain collectives


def all_reduce(t: torch.Tensor, group: Group) -> torch.Tensor:
    """Sum over the group, in place on a contiguous copy."""
    if group_size(group) == 1:
        return t
    out = t.contiguous().clone()
    with TIMER.measure(out):
        dist.all_reduce(out, group=group)
    return out


def all_gather_rows(t: torch.Tensor, group: Group) -> torch.Tensor:
    """The group's equal row blocks, concatenated in rank order."""
    size = group_size(group)
    if size == 1:
        return t
    t = t.contiguous()
    out = t.new_empty((t.shape[0] * size, *t.shape[1:]))
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    with TIMER.measure(out):
        gather(out, t, group=group)
    return out


def reduce_scatter_rows(t: torch.Tensor, group: Group) -> torch.Tensor:
    """Sum over the group, then keep this rank's block of rows. Falls back to all-reduce + slice where
    the backend has no reduce-scatter (older gloo builds)."""
    size = group_size(group)
    if size == 1:
        return t
    t = t.contiguous()
    rows = t.shape[0] // size
    out = t.new_empty((rows, *t.shape[1:]))
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    with TIMER.measure(out):
        try:
            scatter(out, t, group=group)
        except RuntimeError as exc:
            if "support" not in str(exc).lower():  # "does not support" / "not supported"
                raise
            summed = t.clone()
            dist.all_reduce(summed, group=group)
            out = summed[group_rank(group) * rows : (group_rank(group) + 1) * rows].clone()
    return out


def all_to_all(t: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Group) -> torch.Tensor:
    """Send ``in_splits[q]`` consecutive rows to rank q of the group; receive ``out_splits[q]`` from it."""
    if group_size(group) == 1:
        return t
    t = t.contiguous()
    out = t.new_empty((sum(out_splits), *t.shape[1:]))
    with TIMER.measure(out):
        dist.all_to_all_single(out, t, out_splits, in_splits, group=group)
    return out


# ------------------------------------------------------------------------------------ autograd pairs


class _CopyToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return all_reduce(grad, ctx.group), None


class _ReduceFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:  # type: ignore[override]
        return all_reduce(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad, None


def copy_to_group(x: torch.Tensor, group: Group) -> torch.Tensor:
    """Forward: x as is; backward: the input gradient summed over the group (column-parallel input)."""
    return x if group_size(group) == 1 else _CopyToGroup.apply(x, group)


def reduce_from_group(x: torch.Tensor, group: Group) -> torch.Tensor:
    """Forward: sum over the group; backward: the gradient as is (row-parallel output)."""
    return x if group_size(group) == 1 else _ReduceFromGroup.apply(x, group)


def _functional(*names: str) -> Any:
    """The first of ``names`` this torch's functional collectives have (their names moved between
    releases: ``all_gather_tensor_autograd`` became ``all_gather_single_autograd``)."""
    for name in names:
        found = getattr(_fc, name, None)
        if found is not None:
            return found
    raise ImportError(f"torch.distributed._functional_collectives has none of {', '.join(names)}")


def _time_backward(out: torch.Tensor) -> None:
    """Count the collective the backward of ``out`` runs in ``TIMER``: from the gradient reaching
    ``out``'s ``wait_tensor`` node to the collective's own backward node having waited for its
    result (the chain the functional collectives record: wait, wrap, collective)."""
    first = out.grad_fn
    if first is None:
        return
    node = first
    while True:
        nxt = [f for f, _ in node.next_functions if f is not None and "c10d_functional" in f.name()]
        if not nxt:
            break
        node = nxt[0]
    started: list[float] = []

    def start(grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
        for g in grad_outputs:
            if g is not None and g.is_cuda:
                torch.cuda.synchronize(g.device)
        started.append(time.perf_counter())

    def finish(
        grad_inputs: tuple[torch.Tensor | None, ...], grad_outputs: tuple[torch.Tensor | None, ...]
    ) -> tuple[torch.Tensor | None, ...]:
        waited = tuple(_fc.wait_tensor(g) if g is not None else None for g in grad_inputs)
        for g in waited:
            if g is not None and g.is_cuda:
                torch.cuda.synchronize(g.device)
        if started:
            TIMER.add(started.pop(), time.perf_counter())
        return waited

    first.register_prehook(start)
    node.register_hook(finish)


def _collective(op: Any, x: torch.Tensor, *args: Any) -> torch.Tensor:
    """``op(x, *args)`` waited for (so its forward time is all inside ``TIMER``), its backward timed too
    while ``TIMER`` is on."""
    with TIMER.measure(x):
        out = _fc.wait_tensor(op(x.contiguous(), *args))
    if TIMER.enabled and out.requires_grad:
        _time_backward(out)
    return out


def gather_rows(x: torch.Tensor, group: Group) -> torch.Tensor:
    """Forward: all-gather rows; backward: reduce-scatter (sequence-parallel column input)."""
    if group_size(group) == 1:
        return x
    gather = _functional("all_gather_single_autograd", "all_gather_tensor_autograd")
    return _collective(gather, x, 0, group)


def reduce_scatter(x: torch.Tensor, group: Group) -> torch.Tensor:
    """Forward: reduce-scatter rows; backward: all-gather (sequence-parallel row output)."""
    if group_size(group) == 1:
        return x
    scatter = _functional("reduce_scatter_single_autograd", "reduce_scatter_tensor_autograd")
    return _collective(scatter, x, "sum", 0, group)


def exchange_rows(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Group) -> torch.Tensor:
    """Differentiable ``all_to_all_single`` of rows (gradients return along the same routes)."""
    if group_size(group) == 1:
        return x
    if not x.requires_grad:
        return all_to_all(x, out_splits, in_splits, group)
    exchange = _functional("all_to_all_single_autograd")
    return _collective(exchange, x, list(out_splits), list(in_splits), group)


__all__ = [
    "TIMER",
    "CommTimer",
    "all_gather_rows",
    "all_reduce",
    "all_to_all",
    "copy_to_group",
    "exchange_rows",
    "gather_rows",
    "reduce_from_group",
    "reduce_scatter",
    "reduce_scatter_rows",
]
