"""The models ``bench`` times: the block as configured and, for ``compare``, (b) the same block cut in
two fusers with the crossing channels passed by the caller (a model with rerouted channels: cut at every
fuser boundary they cross, each one passed by the caller), and (c) the same math as plain PyTorch.
All three share the weights of (a)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from te_assembly.analysis.plan import Plan
from te_assembly.engines import build
from te_assembly.engines.base import loss_output_names
from te_assembly.jobs.benchmark.plain import PlainModel
from te_assembly.jobs.benchmark.runner import Variant, make_optimizer
from te_assembly.jobs.benchmark.split import SplitModel, SplitPlan, compare_cuts, split_plan

if TYPE_CHECKING:
    from te_assembly.engines.parallel.context import ParallelContext

CHANNELLED = "(a) channelled, one fuser"
REROUTED = "(a) channelled, rerouted"
SPLIT = "(b) split, public tensors"
PLAIN = "(c) plain PyTorch"


def copy_weights(source: torch.nn.Module, target: torch.nn.Module) -> None:
    """Load every tensor of ``target``'s state dict from ``source`` (names agree across engines; a TE
    model's extra state, such as FP8 metadata, has no counterpart in plain PyTorch and is left out)."""
    available = source.state_dict()
    wanted = target.state_dict()
    missing = sorted(set(wanted) - set(available))
    if missing:
        raise KeyError(f"weights missing from the source model: {missing}")
    target.load_state_dict({k: available[k] for k in wanted})


def build_variants(
    plan: Plan,
    *,
    engine: str,
    kernels: str,
    device: torch.device,
    dtype: torch.dtype,
    optimizer: str,
    lr: float,
    compare: bool,
    split_at: str | None = None,
    recipe: Mapping[str, Any] | None = None,
    parallel: ParallelContext | None = None,
) -> tuple[list[Variant], SplitPlan | None]:
    """``parallel``: (a) alone, this rank's part, wrapped for data parallelism (``compare`` is for one
    process)."""
    model = build(
        plan, engine=engine, kernels=kernels, device=device, dtype=dtype, recipe=recipe, parallel=parallel
    )
    losses = loss_output_names(plan)
    name = (REROUTED if plan.reroutes else CHANNELLED) if compare else plan.name
    optim = make_optimizer(model, optimizer, lr)
    if parallel is not None and parallel.is_parallel:
        finish = functools.partial(parallel.finish_grads, model)
        return [Variant(name, parallel.wrap(model), optim, losses, after_backward=finish)], None
    variants = [Variant(name, model, optim, losses)]
    if not compare:
        return variants, None
    split = split_plan(plan, compare_cuts(plan, split_at))
    parts = [
        build(p, engine=engine, kernels=kernels, device=device, dtype=dtype, recipe=recipe)
        for p in split.parts
    ]
    two = SplitModel(split, *parts).load_from(model)
    plain = PlainModel(plan, device=device, dtype=dtype)
    copy_weights(model, plain)
    variants.append(Variant(SPLIT, two, make_optimizer(two, optimizer, lr), losses))
    variants.append(Variant(PLAIN, plain, make_optimizer(plain, optimizer, lr), losses))
    return variants, split
