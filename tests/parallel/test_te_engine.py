"""The TE engine under tensor and expert parallelism on CPU (``te`` tier): our split reference math runs
inside TE's real ``OperationFuser`` (``kernels=reference``) and equals the single process; with TE's
kernels, TE's own ``BasicLinear``/``Bias`` are constructed with TE's tensor-parallel arguments and this
rank's slices (their forward needs a GPU: ``gpu`` tier)."""

from __future__ import annotations

import pytest
import torch

from tests.parallel._worlds import (
    check_te_kernel_ops_are_split,
    randomize,
    run_cases,
    shipped,
    spawn_world,
    starve_last_expert,
)
from tests.parallel._worlds import positive as positive_x

pytestmark = pytest.mark.te

_TE_REF = {"engine": "te", "kernels": "reference"}

CASES = [
    (
        "te engine, tensor: residual_mlp",
        lambda: shipped("residual_mlp", hidden=8, ffn=16),
        {"tensor": 2},
        {"tokens": 12, "prepare": randomize, **_TE_REF},
    ),
    (
        "te engine, tensor + sequence: residual_mlp",
        lambda: shipped("residual_mlp", hidden=8, ffn=16),
        {"tensor": 2, "sequence": 2},
        {"tokens": 12, "prepare": randomize, **_TE_REF},
    ),
    (
        "te engine, expert: moe_block, an expert with no tokens",
        lambda: shipped("moe_block", hidden=8, ffn=8),
        {"expert": 2},
        {"tokens": 16, "prepare": starve_last_expert, "x_transform": positive_x, **_TE_REF},
    ),
    (
        "te engine, data: moe_block",
        lambda: shipped("moe_block", hidden=8, ffn=8),
        {"data": 2},
        {"tokens": 16, "prepare": randomize, **_TE_REF},
    ),
]


def _world(rank: int) -> None:
    run_cases(rank, CASES)
    check_te_kernel_ops_are_split(rank)


def test_te_engine_layouts_equal_the_single_process() -> None:
    spawn_world(2, _world)


def _gpu_world(rank: int) -> None:  # pragma: no cover - needs two GPUs
    run_cases(
        rank,
        [
            (
                "te kernels, tensor: residual_mlp",
                lambda: shipped("residual_mlp", hidden=64, ffn=128),
                {"tensor": 2},
                {
                    "tokens": 64,
                    "prepare": randomize,
                    "engine": "te",
                    "dtype": torch.float32,
                    "device": "cuda",
                    # TE runs float32 GEMMs as TF32: fp16-level tolerances, as in TE's own tests.
                    "tolerance": {"rtol": 1e-2, "atol": 1e-2},
                },
            ),
        ],
    )


@pytest.mark.gpu
def test_te_kernels_tensor_parallel_on_two_gpus() -> None:  # pragma: no cover - needs two GPUs
    if torch.cuda.device_count() < 2:
        pytest.skip("tensor parallelism with TE's kernels needs two CUDA GPUs")
    spawn_world(2, _gpu_world, backend="nccl")
