"""``train.async_checkpoint`` under a real ``torchrun`` (two CPU processes, gloo): data parallel and expert
parallel runs write their checkpoints in the background (DCP over a gloo group of its own), train to the
synchronous run's losses, and resume from a background checkpoint to exactly them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.parallel.test_torchrun import SMALL_MLP, SMALL_MOE, TRAIN, _losses, _ok, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


@pytest.mark.parametrize(
    ("name", "job"),
    [("data", [*SMALL_MLP, "parallel.data=2"]), ("expert", [*SMALL_MOE, "parallel.expert=2"])],
)
def test_background_checkpoints_under_torchrun_resume_exactly(
    name: str, job: list[str], tmp_path: Path
) -> None:
    sync = torchrun(["train", *job, *TRAIN, "train.out_dir=sync"], tmp_path)
    _ok(sync)
    cut = torchrun(
        ["train", *job, *TRAIN, "train.out_dir=cut", "train.async_checkpoint=true", "train.stop_after=6"],
        tmp_path,
    )
    _ok(cut)
    assert sorted(p.name for p in (tmp_path / "cut").glob("ckpt-*")) == [
        "ckpt-0000004.dcp",
        "ckpt-0000006.dcp",
    ]
    again = torchrun(
        ["train", *job, *TRAIN, "train.out_dir=cut", "train.async_checkpoint=true", "train.resume=true"],
        tmp_path,
    )
    _ok(again)
    assert "resumed from cut/ckpt-0000006.dcp (step 6)" in again.stdout, again.stdout
    assert _losses(tmp_path / "cut") == _losses(tmp_path / "sync")
