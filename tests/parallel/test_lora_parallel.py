"""LoRA under ``torchrun`` (gloo, CPU): FSDP2 and data-parallel runs with a frozen base equal the
single-process run in float64 (losses and adapters), their checkpoints hold only the adapters (DCP pieces
or one gathered file), a sharded run resumes on one process
exactly, and a data-parallel run resumes on its own layout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from te_assembly.formats.checkpoint import list_checkpoints, model_state
from tests.parallel.test_fsdp import COMMON as FSDP_COMMON
from tests.parallel.test_fsdp import MODEL, TOL, TRAIN, _same_weights
from tests.parallel.test_torchrun import _losses, _ok, single, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

# test_fsdp.py's model and steps (two block uses: two FSDP2 units), with rank-2 adapters.
COMMON = [*FSDP_COMMON, "lora.rank=2", "lora.alpha=4"]


def _train(out: str, *extra: str) -> list[str]:
    return ["train", *MODEL, *COMMON, *TRAIN, f"train.out_dir={out}", *extra]


def _adapters(run: Path, step: int) -> dict[str, torch.Tensor]:
    state = model_state(dict(list_checkpoints(run))[step])[1]
    assert state and all(".lora_A" in k or ".lora_B" in k for k in state), sorted(state)[:5]
    return state


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lora")
    _ok(single(_train("single"), root))
    return root / "single"


def test_fsdp2_with_adapters_equals_one_process_and_resumes_there(baseline: Path, tmp_path: Path) -> None:
    _ok(torchrun(_train("sharded", "parallel.shard=2"), tmp_path))
    run = tmp_path / "sharded"
    torch.testing.assert_close(_losses(run), _losses(baseline), **TOL)
    _same_weights(_adapters(run, 6), _adapters(baseline, 6))
    trained = _adapters(baseline, 6)
    assert all(trained[k].abs().max() > 0 for k in trained if ".lora_B" in k)  # B left zero: it trained
    # 2 -> 1: stopped at step 3 by two ranks, resumed by one process (the base loaded again).
    _ok(torchrun(_train("half", "parallel.shard=2", "train.stop_after=3"), tmp_path))
    _ok(single(_train("half", "train.resume=true"), tmp_path))
    torch.testing.assert_close(_losses(tmp_path / "half"), _losses(baseline), **TOL)
    _same_weights(_adapters(tmp_path / "half", 6), _adapters(baseline, 6))


def test_data_parallel_with_adapters_equals_one_process_and_resumes(baseline: Path, tmp_path: Path) -> None:
    _ok(torchrun(_train("dp", "parallel.data=2"), tmp_path))
    torch.testing.assert_close(_losses(tmp_path / "dp"), _losses(baseline), **TOL)
    _same_weights(_adapters(tmp_path / "dp", 6), _adapters(baseline, 6))
    # Stopped at step 3 and resumed by the same two ranks: each loads the adapters-only file over
    # the base it built (the frozen weights are not in the checkpoint).
    _ok(torchrun(_train("half", "parallel.data=2", "train.stop_after=3"), tmp_path))
    _ok(torchrun(_train("half", "parallel.data=2", "train.resume=true"), tmp_path))
    torch.testing.assert_close(_losses(tmp_path / "half"), _losses(baseline), **TOL)
    _same_weights(_adapters(tmp_path / "half", 6), _adapters(baseline, 6))
