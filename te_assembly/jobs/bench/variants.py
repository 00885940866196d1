"""The models ``bench`` times: the block as configured and, for ``compare``, (b) the same block cut in
two fusers with the crossing channels passed by the caller (a model with rerouted channels: cut at every
fuser boundary they cross, each one passed by the caller), and (c) the same math as plain PyTorch.
All three share the weights of (a)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from te_assembly.analysis.plan import Plan
from te_assembly.engines.base import loss_output_names
from te_assembly.engines.target import Target
from te_assembly.engines.weights import copy_weights
from te_assembly.jobs.bench.plain import PlainModel
from te_assembly.jobs.bench.runner import Variant
from te_assembly.jobs.bench.split import SplitModel, SplitPlan, compare_cuts, split_plan
from te_assembly.jobs.optimizer import OptimizerSpec, make_optimizer

if TYPE_CHECKING:
    pass

CHANNELLED = "(a) channelled, one fuser"
REROUTED = "(a) channelled, rerouted"
SPLIT = "(b) split, public tensors"
PLAIN = "(c) plain PyTorch"


def build_variants(
    plan: Plan,
    target: Target,
    *,
    optimizer: str = "adamw",
    lr: float = 1e-3,
    compare: bool = False,
    split_at: str | None = None,
) -> tuple[list[Variant], SplitPlan | None]:
    """The variants to time, built on ``target``, each with ``train``'s optimizer of ``optimizer`` at
    ``lr`` (``jobs.optimizer.make_optimizer``). A parallel target: (a) alone, this rank's part, wrapped
    for data parallelism (``compare`` is for one process)."""
    spec = OptimizerSpec(optimizer, lr)
    model = target.build(plan)
    losses = loss_output_names(plan)
    name = (REROUTED if plan.reroutes else CHANNELLED) if compare else plan.name
    optim = make_optimizer(model.parameters(), spec)
    if target.is_parallel:
        assert target.parallel is not None
        finish = functools.partial(target.parallel.finish_grads, model)
        return [Variant(name, target.parallel.wrap(model), optim, losses, after_backward=finish)], None
    variants = [Variant(name, model, optim, losses)]
    if not compare:
        return variants, None
    split = split_plan(plan, compare_cuts(plan, split_at))
    two = SplitModel(split, *(target.build(p) for p in split.parts)).load_from(model)
    plain = PlainModel(plan, device=target.device, dtype=target.dtype)
    copy_weights(model, plain)
    variants.append(Variant(SPLIT, two, make_optimizer(two.parameters(), spec), losses))
    variants.append(Variant(PLAIN, plain, make_optimizer(plain.parameters(), spec), losses))
    return variants, split
