"""Elastic restarts under a real ``torchrun --max-restarts=1`` (two CPU processes, gloo): a worker killed
with SIGKILL at any instant (before the first checkpoint, between two, or while one is being written)
makes torchrun restart both workers, which resume from the newest complete checkpoint
(``train.resume=auto``) and end on exactly the uninterrupted run's losses and weights."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.parallel.test_torchrun import _env, _losses, _ok, records_written, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

JOB = [
    "train",
    "model=residual_mlp",
    "model.dims.hidden=64",
    "model.dims.ffn=128",
    "train.steps=60",
    "train.batch_tokens=1024",
    "train.checkpoint_every=10",
    "train.keep_checkpoints=10",
    "train.plot=false",
    "train.resume=auto",
    "parallel.data=2",
    "parallel.timeout_s=30",
]


def _worker(agent: int, rank: int) -> int | None:
    """The pid of ``agent``'s worker of ``rank`` (torchrun's children carry RANK in their environment)."""
    for task in Path(f"/proc/{agent}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"RANK={rank}".encode() in environ:
                return int(child)
    return None


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run the restarted ones must end on (once for every instant)."""
    where = tmp_path_factory.mktemp("uninterrupted")
    _ok(torchrun([*JOB, "train.out_dir=full"], where, timeout=600))
    return where / "full"


@pytest.mark.parametrize("at", [3, 15, 30])
def test_a_worker_killed_at_any_instant_restarts_and_resumes_exactly(
    at: int, uninterrupted: Path, tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    log = tmp_path / "restarted.txt"
    with log.open("w") as out:
        job = subprocess.Popen(
            [*command, "--max-restarts=1", "-m", "te_assembly", *JOB, "train.out_dir=cut"],
            cwd=tmp_path,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and records_written(tmp_path / "cut") < at and job.poll() is None:
            time.sleep(0.02)
        victim = _worker(job.pid, 1)
        assert victim is not None, log.read_text()[-3000:]
        os.kill(victim, signal.SIGKILL)
        code = job.wait(timeout=400)
    text = log.read_text()
    assert code == 0, text[-4000:]
    assert _losses(tmp_path / "cut") == _losses(uninterrupted), text[-3000:]
    mine, theirs = (load_file(str(d / "ckpt-0000060.safetensors")) for d in (tmp_path / "cut", uninterrupted))
    assert mine.keys() == theirs.keys() and all(mine[k].equal(theirs[k]) for k in mine)
