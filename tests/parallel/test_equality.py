"""Parallel runs equal the single process: real multi-process gloo worlds on CPU, float64 (FSDP2's
``parallel.shard`` too: alone, with expert parallelism, and as HSDP).

Each case builds the single-process model and the parallel one from the same weights (randomized, so
zero biases and unit norm scales hide nothing), runs the same global batch (each rank its rows), and
compares outputs, public extras, the input gradient and every parameter gradient (gathered to global
shapes), per rank. The objective is the mean over the batch's row shards of each shard's loss
(``_worlds.shard_loss``); the router's aux loss is per shard, as each rank computes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from te_assembly.analysis.parallel.settings import ParallelSettings
from te_assembly.analysis.plan import Plan
from te_assembly.engines.target import Target
from tests.parallel._worlds import (
    inline,
    positive,
    randomize,
    run_cases,
    shipped,
    spawn_world,
    starve_last_expert,
)

MOE_SCALED = """
name: moe_scaled
in_features: 8
ops:
  - {name: residual, op: MakeExtraOutput, extra_outputs: {out: {channel: residual, public: false}}}
  - {name: norm, op: RMSNorm, args: {normalized_shape: 8}}
  - name: router
    op: TopKRouter
    args: {in_features: 8, num_experts: 4, top_k: 2}
    extra_outputs:
      probs: {channel: probs, public: false}
      routing_map: {channel: routing_map, public: false}
      aux_loss: {channel: aux_loss, public: true}
  - name: dispatch
    op: Dispatch
    args: {num_experts: 4, top_k: 2}
    extra_inputs: {probs: probs, routing_map: routing_map}
    extra_outputs:
      split_sizes: {channel: split_sizes, public: false}
      row_probs: {channel: row_probs, public: false}
      row_map: {channel: row_map, public: false}
  - name: fc1
    op: GroupedLinear
    args: {num_groups: 4, in_features: 8, out_features: 12}
    extra_inputs: {split_sizes: split_sizes}
  - {name: tap, op: MakeExtraOutput, extra_outputs: {out: {channel: tap, public: false}}}
  - {name: again, op: AddExtraInput, extra_inputs: {addend: tap}}
  - {name: act, op: ScaledSwiGLU, extra_inputs: {scales: row_probs}}
  - name: fc2
    op: GroupedLinear
    args: {num_groups: 4, in_features: 6, out_features: 8, scale_bias: true}
    extra_inputs: {split_sizes: split_sizes, scales: row_probs}
  - {name: combine, op: Combine, args: {top_k: 2}, extra_inputs: {row_map: row_map}}
  - {name: add_residual, op: AddExtraInput, extra_inputs: {addend: residual}}
"""

TP_MIXED = """
name: tp_mixed
in_features: 8
ops:
  - {name: up, op: BasicLinear, args: {in_features: 8, out_features: 16, tensor_parallel_mode: column}}
  - {name: up_bias, op: Bias, args: {size: 16}}
  - {name: act, op: GEGLU}
  - {name: scale, op: ConstantScale, args: {scale: 0.5}}
  - {name: down, op: Linear, args: {in_features: 8, out_features: 8, tensor_parallel_mode: row}}
  - {name: norm, op: LayerNorm, args: {normalized_shape: 8}}
  - {name: up2, op: Linear, args: {in_features: 8, out_features: 12, tensor_parallel_mode: column}}
  - {name: act2, op: SReLU}
  - name: down2
    op: Linear
    args: {in_features: 12, out_features: 8, bias: false, tensor_parallel_mode: row}
"""

MLP_THEN_MOE = """
name: mlp_then_moe
in_features: 8
ops:
  - {name: up, op: Linear, args: {in_features: 8, out_features: 16, tensor_parallel_mode: column}}
  - {name: gelu, op: GELU}
  - {name: down, op: Linear, args: {in_features: 16, out_features: 8, tensor_parallel_mode: row}}
  - name: router
    op: TopKRouter
    args: {in_features: 8, num_experts: 4, top_k: 2}
    extra_outputs:
      probs: {channel: probs, public: false}
      routing_map: {channel: routing_map, public: false}
  - name: dispatch
    op: Dispatch
    args: {num_experts: 4, top_k: 2}
    extra_inputs: {probs: probs, routing_map: routing_map}
    extra_outputs:
      split_sizes: {channel: split_sizes, public: false}
      row_probs: {channel: row_probs, public: false}
      row_map: {channel: row_map, public: false}
  - name: fc1
    op: GroupedLinear
    args: {num_groups: 4, in_features: 8, out_features: 12}
    extra_inputs: {split_sizes: split_sizes}
  - {name: act, op: ScaledSwiGLU, extra_inputs: {scales: row_probs}}
  - name: fc2
    op: GroupedLinear
    args: {num_groups: 4, in_features: 6, out_features: 8}
    extra_inputs: {split_sizes: split_sizes}
  - {name: combine, op: Combine, args: {top_k: 2}, extra_inputs: {row_map: row_map}}
"""

Case = tuple[str, Callable[[], Plan], dict[str, int], dict[str, Any]]


def _mlp() -> Plan:
    return shipped("residual_mlp", hidden=8, ffn=16)


def _fanout() -> Plan:
    return shipped("fanout_mlp", hidden=8, ffn=16)


def _moe() -> Plan:
    return shipped("moe_block", hidden=8, ffn=8)


_RANDOM: dict[str, Any] = {"prepare": randomize}
_STARVED: dict[str, Any] = {"prepare": starve_last_expert, "x_transform": positive}

TWO_PROCESSES: list[Case] = [
    ("tensor: residual_mlp (SwiGLU halves interleaved)", _mlp, {"tensor": 2}, {"tokens": 12, **_RANDOM}),
    (
        "tensor: BasicLinear, a Bias in the region, GEGLU, two regions",
        lambda: inline(TP_MIXED),
        {"tensor": 2},
        {"tokens": 12, **_RANDOM},
    ),
    ("tensor + sequence: residual_mlp", _mlp, {"tensor": 2, "sequence": 2}, {"tokens": 12, **_RANDOM}),
    (
        "tensor + sequence: fanout_mlp (public channel)",
        _fanout,
        {"tensor": 2, "sequence": 2},
        {"tokens": 12, **_RANDOM},
    ),
    ("data: residual_mlp", _mlp, {"data": 2}, {"tokens": 12, **_RANDOM}),
    ("shard: moe_block (FSDP2)", _moe, {"shard": 2}, {"tokens": 16, **_RANDOM}),
    ("data: moe_block", _moe, {"data": 2}, {"tokens": 16, **_RANDOM}),
    ("expert: moe_block, an expert with no tokens", _moe, {"expert": 2}, {"tokens": 16, **_STARVED}),
    ("expert: moe_block, uneven splits", _moe, {"expert": 2}, {"tokens": 10, **_RANDOM}),
    (
        "expert: scale_bias and a channel among expert rows",
        lambda: inline(MOE_SCALED),
        {"expert": 2},
        {"tokens": 16, **_RANDOM},
    ),
]

FOUR_PROCESSES: list[Case] = [
    ("data x expert: moe_block", _moe, {"data": 2, "expert": 2}, {"tokens": 16, **_RANDOM}),
    ("data x expert: an expert with no tokens", _moe, {"data": 2, "expert": 2}, {"tokens": 16, **_STARVED}),
    (
        "expert 4: one expert per rank, one rank receives nothing",
        _moe,
        {"expert": 4},
        {"tokens": 16, **_STARVED},
    ),
    ("data x tensor: residual_mlp", _mlp, {"data": 2, "tensor": 2}, {"tokens": 12, **_RANDOM}),
    ("shard x expert: moe_block", _moe, {"shard": 2, "expert": 2}, {"tokens": 16, **_RANDOM}),
    ("shard x expert: an expert with no tokens", _moe, {"shard": 2, "expert": 2}, {"tokens": 16, **_STARVED}),
    (
        "shard x expert: float32 (no reduce op NCCL alone has)",
        _moe,
        {"shard": 2, "expert": 2},
        {"tokens": 16, **_RANDOM, "dtype": torch.float32, "tolerance": {"rtol": 1e-4, "atol": 1e-5}},
    ),
    (
        "shard x expert: scale_bias and a channel among expert rows",
        lambda: inline(MOE_SCALED),
        {"shard": 2, "expert": 2},
        {"tokens": 16, **_RANDOM},
    ),
    (
        "tensor x expert: split MLP, then MoE",
        lambda: inline(MLP_THEN_MOE),
        {"tensor": 2, "expert": 2},
        {"tokens": 16, **_RANDOM},
    ),
]


EIGHT_PROCESSES: list[Case] = [
    (
        "data x shard x expert (HSDP): moe_block",
        _moe,
        {"data": 2, "shard": 2, "expert": 2},
        {"tokens": 32, **_RANDOM},
    ),
]


def _world(rank: int, table: str) -> None:
    run_cases(rank, globals()[table])
    if table == "TWO_PROCESSES":
        _row_parallel_bias_is_whole(rank)


def _row_parallel_bias_is_whole(rank: int) -> None:
    """te_assembly's row-parallel bias: every rank holds the whole bias (added once, after the
    reduction), so a state dict means the same at any tensor-parallel size; a column bias is sliced."""
    import torch

    from te_assembly.engines import build
    from tests.parallel._worlds import make_context

    plan = _mlp()
    torch.manual_seed(0)
    single = build(plan, Target.of("reference", dtype=torch.float64))
    randomize(single)
    ctx = make_context(plan, ParallelSettings(tensor=2))
    local = build(plan, Target.of("reference", dtype=torch.float64, parallel=ctx))
    ctx.load_global(local, single.state_dict())
    mine = dict(local.named_parameters())
    whole = dict(single.named_parameters())
    torch.testing.assert_close(mine["steps.fc2.basic_ops.1.bias"], whole["steps.fc2.basic_ops.1.bias"])
    assert mine["steps.fc1.basic_ops.1.bias"].shape[0] * 2 == whole["steps.fc1.basic_ops.1.bias"].shape[0]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_process_layouts_equal_the_single_process() -> None:
    """DP, TP (plain and with sequence parallelism) and EP, two processes each."""
    spawn_world(2, _world, "TWO_PROCESSES")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_four_process_layouts_equal_the_single_process() -> None:
    """DP x EP, DP x TP, TP x EP, FSDP2 x EP and one expert per rank, four processes."""
    spawn_world(4, _world, "FOUR_PROCESSES", timeout=300)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_hsdp_with_expert_parallelism_equals_the_single_process() -> None:
    """FSDP2 within pairs, replicated across pairs, and experts split: eight processes, every mesh
    dimension of ``fsdp_meshes`` larger than one."""
    spawn_world(8, _world, "EIGHT_PROCESSES", timeout=400)
