"""The pieces of the parallel layout that need no process group: slicing and joining parameters, the
expert exchange's regrouping, local parameter names."""

from __future__ import annotations

import itertools

import pytest
import torch

from te_assembly.analysis.parallel.layout import ParamShard, local_name, slice_rows
from te_assembly.engines.parallel.expert_ops import regroup_order
from te_assembly.engines.parallel.sharding import join_slices, take_slice


@pytest.mark.parametrize(("size", "blocks", "dim"), list(itertools.product((1, 2, 4), (1, 2, 4), (0, 1))))
def test_slices_join_back_to_the_whole(size: int, blocks: int, dim: int) -> None:
    full = torch.randn(16, 8) if dim == 0 else torch.randn(8, 16)
    rule = ParamShard("tensor", dim, blocks)
    pieces = [take_slice(full, rule, t, size) for t in range(size)]
    assert all(p.shape[dim] == 16 // size for p in pieces)
    torch.testing.assert_close(join_slices(pieces, rule), full, rtol=0, atol=0)


def test_interleaved_pieces_give_each_rank_matching_halves() -> None:
    """A gated activation splits its input [a | b]: rank t must hold a_t and b_t, not a whole half."""
    full = torch.arange(8.0)  # a = 0..3, b = 4..7
    rule = ParamShard("tensor", 0, 2)
    assert take_slice(full, rule, 0, 2).tolist() == [0.0, 1.0, 4.0, 5.0]
    assert take_slice(full, rule, 1, 2).tolist() == [2.0, 3.0, 6.0, 7.0]
    assert slice_rows(8, rule, 1, 2) == [(2, 4), (6, 8)]


@pytest.mark.parametrize("seed", range(6))
def test_regroup_order_lists_rows_by_expert_then_source(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 4, (3, 2), generator=generator)  # 3 source ranks, 2 local experts; zeros too
    # Label each arriving row with (source, expert), in arrival order: source-major, then expert.
    labels = [(q, e) for q in range(3) for e in range(2) for _ in range(int(counts[q, e]))]
    order = regroup_order(counts).tolist()
    assert sorted(order) == list(range(len(labels)))  # a permutation
    regrouped = [labels[i] for i in order]
    assert regrouped == sorted(labels, key=lambda qe: (qe[1], qe[0]))  # stable within each block


def test_no_rows_at_all() -> None:
    assert regroup_order(torch.zeros(2, 2, dtype=torch.int64)).numel() == 0


def test_expert_parameters_are_renumbered_locally() -> None:
    rule = ParamShard("expert", group=5, prefix="weight")
    assert local_name("weight5", rule, expert_rank=2, local_groups=2) == "weight1"  # experts 4, 5 on rank 2
    assert local_name("weight5", rule, expert_rank=1, local_groups=2) is None
    assert local_name("bias", ParamShard("replicated"), expert_rank=1, local_groups=2) == "bias"


def test_the_communication_clock_counts_overlapping_collectives_once() -> None:
    from te_assembly.engines.parallel.collectives import CommTimer

    timer = CommTimer()
    for start, end in ((0.0, 1.0), (0.5, 2.0), (3.0, 3.5), (3.1, 3.2)):
        timer.add(start, end)
    assert timer.seconds == pytest.approx(2.5) and timer.calls == 4
    timer.reset()
    assert timer.seconds == 0.0


class _Holds(torch.nn.Module):
    """Stands for an expert rank's model: just its parameters' names, in its order."""

    def __init__(self, names: list[str]) -> None:
        super().__init__()
        self.held = [(name, torch.nn.Parameter(torch.zeros(1))) for name in names]

    def named_parameters(self, *args: object, **kwargs: object):  # type: ignore[no-untyped-def,override]
        return iter(self.held)


def test_checkpoints_key_optimizer_state_by_one_process_order_on_every_expert_rank() -> None:
    """``optimizer_index`` with the experts split: a router's expert-bias buffer (listed with the plan's
    parameters, but no parameter) takes no index, and each expert rank's ``weight0`` is its first
    expert's index in a single process's optimizer."""
    import textwrap
    from types import SimpleNamespace

    import yaml

    from te_assembly import load
    from te_assembly.analysis.parallel.layout import shard_plan
    from te_assembly.analysis.parallel.settings import ParallelSettings
    from te_assembly.engines import build
    from te_assembly.engines.parallel.context import ParallelContext
    from tests.parallel.test_equality import MOE_SCALED

    model = yaml.safe_load(textwrap.dedent(MOE_SCALED))
    assert model["ops"][2]["op"] == "TopKRouter"
    model["ops"][2]["args"]["enable_expert_bias"] = True
    plan = load(model).checked_plan()
    single = [name for name, _ in build(plan, "reference").named_parameters()]
    assert "steps.router.expert_bias" not in single and single[-1] == "steps.fc2.bias3"
    layout, _ = shard_plan(plan, ParallelSettings(expert=2, shard=2))
    assert layout is not None
    for expert_rank in (0, 1):
        ctx = ParallelContext(plan, layout, SimpleNamespace(expert_rank=expert_rank))  # type: ignore[arg-type]
        mine = [local for local, key in ctx.local_to_global.items() if key in single]
        index = ctx.optimizer_index(_Holds(mine))
        assert "steps.router.expert_bias" not in index
        for local in mine:
            assert index[ctx.local_to_global[local]] == single.index(ctx.local_to_global[local]), local
    assert ctx.local_to_global["steps.fc1.weight0"] == "steps.fc1.weight2"
