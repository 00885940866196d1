"""``train.async_checkpoint``: checkpoints written in the background by DCP's ``async_save``. The steps go
on while one is written; it counts only once complete, so a process killed mid-write keeps the previous
checkpoint as its newest and the same command resumes from it to exactly the uninterrupted run."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from te_assembly import load
from te_assembly.engines.target import Target
from te_assembly.formats.checkpoint import newest_good, scan
from te_assembly.jobs.train.job import train
from te_assembly.jobs.train.metrics import read_records
from te_assembly.jobs.train.settings import TrainSettings
from tests.conftest import REPO_ROOT, user_cli

pytestmark = pytest.mark.slow


def _settings(out: Path, **more: object) -> TrainSettings:
    base = {"steps": 8, "batch_tokens": 32, "out_dir": str(out), "plot": False, "loggers": []}
    return TrainSettings(**{**base, "checkpoint_every": 2, "resume": "auto", **more})  # type: ignore[arg-type]


def test_background_checkpoints_resume_to_the_uninterrupted_run(tmp_path: Path) -> None:
    plan = load("residual_mlp").checked_plan()
    target = Target.of("reference", seed=3)
    whole = train(plan, target, dataclasses.replace(_settings(tmp_path / "sync"), resume=False))
    background = train(plan, target, _settings(tmp_path / "async", async_checkpoint=True))
    assert background.losses == whole.losses
    kept = sorted(p.name for p in (tmp_path / "async").glob("ckpt-*"))
    assert kept == ["ckpt-0000006.dcp", "ckpt-0000008.dcp"]  # complete DCP directories, pruned to 2
    assert [c.name for c in background.checkpoints][-1] == "ckpt-0000008.dcp"
    cut = train(plan, target, _settings(tmp_path / "cut", async_checkpoint=True, stop_after=5))
    assert cut.last_step == 5
    resumed = train(plan, target, _settings(tmp_path / "cut", async_checkpoint=True))
    assert any("ckpt-0000005.dcp" in n or "step 5" in n for n in resumed.notes), resumed.notes
    losses = [r["loss"] for r in read_records(tmp_path / "cut" / "metrics.jsonl")]
    assert losses == whole.losses


DRIVER = """
import sys, threading
from torch.distributed.checkpoint import HuggingFaceStorageWriter
real = HuggingFaceStorageWriter.write_data

def write_data(self, plan, planner):
    if "ckpt-0000004" in str(self.path):
        threading.Event().wait()  # this write never ends: the process is killed during it
    return real(self, plan, planner)

HuggingFaceStorageWriter.write_data = write_data
from te_assembly.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_kill_during_the_background_write_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    """Step 4's checkpoint never finishes writing; the steps after it run meanwhile (the step does not
    wait for the write); SIGKILL then: step 2's checkpoint is the newest, step 4's temporary directory
    is never read, and the same command resumes from step 2 to exactly the uninterrupted losses."""
    args = [
        "train",
        "model=residual_mlp",
        "train.batch_tokens=32",
        "train.steps=200",
        "train.checkpoint_every=2",
        "train.keep_checkpoints=5",
        "train.plot=false",
        "train.resume=auto",
        "train.async_checkpoint=true",
        "hydra.run.dir=run",
        "seed=4",
    ]
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(DRIVER))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "NO_COLOR": "1", "COLUMNS": "400"}
    run = tmp_path / "run"
    log = (tmp_path / "log.txt").open("w")
    job = subprocess.Popen(
        [sys.executable, str(driver), *args], cwd=tmp_path, env=env, stdout=log, stderr=log
    )
    deadline = time.monotonic() + 120

    def steps() -> int:
        metrics = run / "metrics.jsonl"
        return len(metrics.read_text().splitlines()) if metrics.exists() else 0

    while time.monotonic() < deadline and steps() < 5 and job.poll() is None:
        time.sleep(0.05)
    assert steps() >= 5, (tmp_path / "log.txt").read_text()  # step 5 ran while step 4 was being written
    time.sleep(0.3)
    job.send_signal(signal.SIGKILL)
    job.wait(timeout=60)
    assert any(p.name.startswith(".ckpt-0000004.dcp") for p in run.iterdir())  # the write under way
    good, _, _ = newest_good(scan(run))
    assert good is not None and good.step == 2
    whole = user_cli(
        tmp_path,
        *[a for a in args if not a.startswith(("hydra.run.dir", "train.steps"))],
        "train.steps=8",
        "hydra.run.dir=whole",
        "train.async_checkpoint=false",
    )
    assert whole.returncode == 0, whole.stderr
    again = user_cli(tmp_path, *[a for a in args if not a.startswith("train.steps")], "train.steps=8")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "ckpt-0000002.dcp" in again.stdout
    assert not any(p.name.startswith(".ckpt-") for p in run.iterdir())  # the half-written one removed
    mine = [r["loss"] for r in read_records(run / "metrics.jsonl")]
    assert mine == [r["loss"] for r in read_records(tmp_path / "whole" / "metrics.jsonl")]


def test_async_checkpoint_with_tensor_parallelism_is_refused_at_validation(tmp_path: Path) -> None:
    done = user_cli(
        tmp_path, "validate", "model=residual_mlp", "parallel.tensor=2", "train.async_checkpoint=true"
    )
    assert done.returncode == 2
    assert "train.async_checkpoint: train.async_checkpoint=true with parallel.tensor=2" in done.stderr
