"""``train.resume=auto``: one command for a first start and every restart. In an empty directory it
starts fresh; where a checkpoint is, it continues from the newest good one and ends on exactly the
uninterrupted run's losses; in a new default run directory it starts fresh and says how to name one."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from te_assembly import load
from te_assembly.engines.target import Target
from te_assembly.jobs.train.job import train
from te_assembly.jobs.train.metrics import read_records
from te_assembly.jobs.train.settings import TrainSettings
from tests.conftest import user_cli


def _settings(out: Path, **more: object) -> TrainSettings:
    base = {"steps": 8, "batch_tokens": 32, "out_dir": str(out), "plot": False, "loggers": []}
    return TrainSettings(**{**base, "checkpoint_every": 2, "resume": "auto", **more})  # type: ignore[arg-type]


def test_the_same_settings_start_and_then_continue(tmp_path: Path) -> None:
    plan = load("residual_mlp").checked_plan()
    target = Target.of("reference", seed=5)
    whole = train(plan, target, dataclasses.replace(_settings(tmp_path / "whole"), resume=False))
    first = train(plan, target, _settings(tmp_path / "run", stop_after=3))  # an empty directory: fresh
    assert first.last_step == 3 and not any("continu" in n for n in first.notes)
    again = train(plan, target, _settings(tmp_path / "run"))  # the restart: the very same command
    losses = [r["loss"] for r in read_records(tmp_path / "run" / "metrics.jsonl")]
    assert losses == whole.losses  # from the step-2 checkpoint on, exactly the uninterrupted run
    assert again.last_step == 8


def test_from_the_command_line_with_a_named_directory_and_without(tmp_path: Path) -> None:
    args = ["train", "model=residual_mlp", "train.batch_tokens=32", "train.resume=auto", "hydra.run.dir=run"]
    assert user_cli(tmp_path, *args, "train.steps=2").returncode == 0
    done = user_cli(tmp_path, *args, "train.steps=4")
    assert done.returncode == 0, done.stderr
    assert [r["step"] for r in read_records(tmp_path / "run" / "metrics.jsonl")] == [1, 2, 3, 4]
    fresh = user_cli(tmp_path, "train", "model=residual_mlp", "train.steps=2", "train.resume=auto")
    assert fresh.returncode == 0 and "is new, so the run starts fresh" in fresh.stdout
