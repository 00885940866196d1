"""LoRA under ``torchrun`` (gloo, CPU): FSDP2 and data-parallel runs with a frozen base equal the
single-process run in float64 (losses and adapters), their checkpoints hold only the adapters (DCP pieces
or one gathered file), and a sharded run resumes on one process exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from te_assembly.formats.checkpoint import list_checkpoints, model_state
from tests.parallel.test_torchrun import _losses, _ok, single, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

MODEL = ["model=dense_transformer", "model.dims.hidden=32", "model.dims.ffn=64", "model.dims.heads=2"]
COMMON = ["engine=reference", "dtype=float64", "seed=3", "lora.rank=2", "lora.alpha=4"]
TRAIN = [
    "train.steps=6",
    "train.batch_tokens=128",
    "train.seq_len=16",
    "train.checkpoint_every=3",
    "train.keep_checkpoints=4",
    "train.plot=false",
    "train.warmup_steps=2",
]
TOL = {"rtol": 1e-9, "atol": 1e-11}


def _train(out: str, *extra: str) -> list[str]:
    return ["train", *MODEL, *COMMON, *TRAIN, f"train.out_dir={out}", *extra]


def _adapters(run: Path, step: int) -> dict[str, torch.Tensor]:
    state = model_state(dict(list_checkpoints(run))[step])[1]
    assert state and all(".lora_A" in k or ".lora_B" in k for k in state), sorted(state)[:5]
    return state


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        torch.testing.assert_close(a[name], b[name], **TOL, msg=lambda m, n=name: f"{n}: {m}")


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lora")
    _ok(single(_train("single"), root))
    return root / "single"


def test_fsdp2_with_adapters_equals_one_process_and_resumes_there(baseline: Path, tmp_path: Path) -> None:
    _ok(torchrun(_train("sharded", "parallel.shard=2"), tmp_path))
    run = tmp_path / "sharded"
    torch.testing.assert_close(_losses(run), _losses(baseline), **TOL)
    _same(_adapters(run, 6), _adapters(baseline, 6))
    trained = _adapters(baseline, 6)
    assert all(trained[k].abs().max() > 0 for k in trained if ".lora_B" in k)  # B left zero: it trained
    # 2 -> 1: stopped at step 3 by two ranks, resumed by one process (the base loaded again).
    _ok(torchrun(_train("half", "parallel.shard=2", "train.stop_after=3"), tmp_path))
    _ok(single(_train("half", "train.resume=true"), tmp_path))
    torch.testing.assert_close(_losses(tmp_path / "half"), _losses(baseline), **TOL)
    _same(_adapters(tmp_path / "half", 6), _adapters(baseline, 6))


def test_data_parallel_with_adapters_equals_one_process(baseline: Path, tmp_path: Path) -> None:
    _ok(torchrun(_train("dp", "parallel.data=2"), tmp_path))
    torch.testing.assert_close(_losses(tmp_path / "dp"), _losses(baseline), **TOL)
    _same(_adapters(tmp_path / "dp", 6), _adapters(baseline, 6))
