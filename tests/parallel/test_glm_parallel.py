"""GLM-4.5-MoE (``glm4_moe_tiny``: a dense first layer, then sigmoid-routed experts with an expert bias
and groups, shared experts) under ``torchrun`` (gloo, CPU): expert parallelism and FSDP2 train exactly as
one process does, in float64."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.parallel.test_torchrun import _losses, _ok, single, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

ARGS = [
    "train",
    "model=glm4_moe_tiny",
    "engine=reference",
    "dtype=float64",
    "seed=2",
    "train.steps=4",
    "train.batch_tokens=128",
    "train.seq_len=16",
    "train.plot=false",
    "train.eval_every=0",
]


def test_expert_parallel_and_fsdp2_glm_runs_equal_one_process(tmp_path: Path) -> None:
    _ok(single([*ARGS, "train.out_dir=one"], tmp_path))
    _ok(torchrun([*ARGS, "parallel.expert=2", "train.out_dir=ep"], tmp_path))
    _ok(torchrun([*ARGS, "parallel.shard=2", "train.out_dir=fsdp"], tmp_path))
    one = _losses(tmp_path / "one")
    assert one[-1] < one[0]
    for run in ("ep", "fsdp"):
        torch.testing.assert_close(_losses(tmp_path / run), one, rtol=1e-9, atol=1e-11)
