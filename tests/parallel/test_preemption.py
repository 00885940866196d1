"""Preemption under a real ``torchrun`` (two CPU processes, gloo): SIGTERM to the whole job, as Slurm sends
it to every process of a job step (torchrun's agent then passes its own on), makes every rank end its
step, write one checkpoint of it and exit 143; the same command again (``train.resume=auto``) resumes
there and ends on exactly the uninterrupted run's losses and weights."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from te_assembly.jobs.train.metrics import read_records
from tests.parallel.test_torchrun import _env, _losses, _ok, records_written, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

JOB = [
    "train",
    "model=residual_mlp",
    "model.dims.hidden=64",
    "model.dims.ffn=128",
    "train.steps=400",
    "train.batch_tokens=2048",
    "train.checkpoint_every=100",
    "train.plot=false",
    "train.resume=auto",
    "parallel.data=2",
]


def test_sigterm_to_the_job_checkpoints_every_rank_and_the_rerun_resumes_exactly(tmp_path: Path) -> None:
    full = torchrun([*JOB, "train.out_dir=full"], tmp_path, timeout=600)
    _ok(full)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    log = tmp_path / "preempted.txt"
    with log.open("w") as out:
        job = subprocess.Popen(
            [*command, "-m", "te_assembly", *JOB, "train.out_dir=cut"],
            cwd=tmp_path,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: the signal reaches the agent and its workers
        )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and records_written(tmp_path / "cut") < 130 and job.poll() is None:
            time.sleep(0.05)
        os.killpg(job.pid, signal.SIGTERM)
        job.wait(timeout=120)
    text = log.read_text()
    stopped = records_written(tmp_path / "cut")
    assert 130 <= stopped < 400, text[-3000:]
    kept = sorted(p.name for p in (tmp_path / "cut").glob("ckpt-*.safetensors"))
    # the step every rank ended is kept, beside the regular one, even though 100 does not divide it
    assert kept == ["ckpt-0000100.safetensors", f"ckpt-{stopped:07d}.safetensors"], (kept, text[-3000:])
    assert text.count("terminated") == 2, text[-3000:]  # each rank said why it ended, with code 143
    # torchrun's agent reports its own SIGTERM with a traceback of torch's; no worker has one of ours
    assert "te_assembly/" not in text, text[-3000:]
    again = torchrun([*JOB, "train.out_dir=cut"], tmp_path, timeout=600)
    _ok(again)
    assert f"resumed from cut/ckpt-{stopped:07d}.safetensors (step {stopped})" in again.stdout, again.stdout
    assert _losses(tmp_path / "cut") == _losses(tmp_path / "full")
    assert [r["step"] for r in read_records(tmp_path / "cut" / "metrics.jsonl")] == list(range(1, 401))
    from safetensors.torch import load_file

    mine, theirs = (load_file(str(tmp_path / d / "ckpt-0000400.safetensors")) for d in ("cut", "full"))
    assert mine.keys() == theirs.keys() and all(mine[k].equal(theirs[k]) for k in mine)
