"""The MoE families of 2025-2026 under ``torchrun`` (gloo, CPU): GLM-4.5-MoE and DeepSeek-V3
(``glm4_moe_tiny``, ``deepseek_v3_tiny``: a dense first layer, then sigmoid-routed experts with an expert
bias and groups, shared experts; DeepSeek's latent attention) and GPT-OSS (``gpt_oss_tiny``: sinks,
alternating windows, experts with biases and a clamped GLU, the router's probability scaling fc2's bias):
expert parallelism and FSDP2 train exactly as one process does, in float64."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.parallel.test_torchrun import _losses, _ok, single, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

ARGS = [
    "train",
    "engine=reference",
    "dtype=float64",
    "seed=2",
    "train.steps=4",
    "train.batch_tokens=128",
    "train.seq_len=16",
    "train.plot=false",
    "train.eval_every=0",
]


@pytest.mark.parametrize("model", ["glm4_moe_tiny", "deepseek_v3_tiny", "gpt_oss_tiny"])
def test_expert_parallel_and_fsdp2_runs_equal_one_process(model: str, tmp_path: Path) -> None:
    # The load-balancing loss is a statistic of each rank's own tokens (docs/guides/parallel-and-fsdp2.md):
    # off here, so the runs compare the model's math alone (GLM's and DeepSeek's have none).
    args = [*ARGS, f"model={model}", *(["model.dims.aux_loss_coeff=0.0"] if model == "gpt_oss_tiny" else [])]
    _ok(single([*args, "train.out_dir=one"], tmp_path))
    _ok(torchrun([*args, "parallel.expert=2", "train.out_dir=ep"], tmp_path))
    _ok(torchrun([*args, "parallel.shard=2", "train.out_dir=fsdp"], tmp_path))
    one = _losses(tmp_path / "one")
    assert one[-1] < one[0]
    for run in ("ep", "fsdp"):
        torch.testing.assert_close(_losses(tmp_path / run), one, rtol=1e-9, atol=1e-11)
