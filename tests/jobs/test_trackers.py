"""``train.loggers``: every step's scalars reach Weights & Biases (offline, in the run directory) and
MLflow (a SQLite store in the run directory) exactly as ``metrics.jsonl`` holds them, a resumed run
continues the same W&B and MLflow run, a tracker that is not installed or cannot start is one clean
message before training, and output that is not a terminal gets one plain line every
``train.log_every`` steps. No network: W&B offline, MLflow local."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from te_assembly import load
from te_assembly.engines.target import Target
from te_assembly.errors import ArgumentError, MissingToolError
from te_assembly.jobs.train import trackers
from te_assembly.jobs.train.job import train
from te_assembly.jobs.train.metrics import read_records
from te_assembly.jobs.train.settings import TrainSettings
from tests.conftest import user_cli
from tests.docs_text import block_after

CONFIG = {"model": {"name": "residual_mlp"}, "train": {"lr": 0.003}}


def _settings(out: Path, steps: int, loggers: list[str], **more: object) -> TrainSettings:
    return TrainSettings(
        steps=steps, batch_tokens=32, out_dir=str(out), plot=False, loggers=loggers, **more
    ).for_task(False)


def _train(out: Path, steps: int, loggers: list[str], **more: object) -> list[dict[str, object]]:
    train(
        load("residual_mlp").checked_plan(),
        Target.of("reference", seed=3),
        _settings(out, steps, loggers, **more),
        config=CONFIG,
    )
    return read_records(out / "metrics.jsonl")


def test_wandb_offline_run_holds_every_step_and_a_resume_continues_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb", reason="the wandb extra")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    first = _train(out, 4, ["wandb"], checkpoint_every=2)
    run_id = json.loads((out / trackers.IDS_FILE).read_text())["wandb"]
    (written,) = list((out / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    data = written.read_bytes()
    for record in first:  # W&B keeps each value as JSON text in its run file
        assert json.dumps(record["loss"]).encode() in data
    assert b"loss/mse(y, teacher)" in data and b"grad_norm" in data
    resumed = _train(out, 6, ["wandb"], checkpoint_every=2, resume=True)
    assert json.loads((out / trackers.IDS_FILE).read_text())["wandb"] == run_id  # the same run
    runs = sorted((out / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    later = b"".join(p.read_bytes() for p in runs)
    assert len(resumed) == 6
    for record in resumed[4:]:
        assert json.dumps(record["loss"]).encode() in later


def test_mlflow_store_holds_every_step_and_the_config_and_a_resume_continues_it(tmp_path: Path) -> None:
    pytest.importorskip("mlflow", reason="the mlflow extra")
    from mlflow.tracking import MlflowClient

    out = tmp_path / "run"
    _train(out, 4, ["mlflow"], checkpoint_every=2)
    run_id = json.loads((out / trackers.IDS_FILE).read_text())["mlflow"]
    records = _train(out, 6, ["mlflow"], checkpoint_every=2, resume=True)
    assert json.loads((out / trackers.IDS_FILE).read_text())["mlflow"] == run_id
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    history = {m.step: m.value for m in client.get_metric_history(run_id, "loss")}
    assert history == {r["step"]: pytest.approx(r["loss"], rel=1e-12) for r in records}
    # a name MLflow does not allow, in its characters
    assert {m.step for m in client.get_metric_history(run_id, "loss/mse_y_ teacher_")} == set(range(1, 7))
    run = client.get_run(run_id)
    assert run.data.params["train.lr"] == "0.003" and run.data.params["model.name"] == "residual_mlp"
    assert run.info.status == "FINISHED"


def test_a_tracker_that_is_not_installed_is_named_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = trackers.Kind("no_such_package_for_te_assembly", "wandb", trackers.WandB)
    monkeypatch.setitem(trackers.KINDS, "wandb", missing)
    with pytest.raises(MissingToolError, match=r"pip install 'te_assembly\[wandb\]'"):
        _train(tmp_path / "run", 2, ["wandb"])
    assert not (tmp_path / "run").exists()  # nothing started
    assert trackers.resolve([]) == ()


def test_a_tracker_that_cannot_start_is_one_line_in_the_cli(tmp_path: Path) -> None:
    pytest.importorskip("mlflow", reason="the mlflow extra")
    result = user_cli(
        tmp_path,
        "train",
        "model=residual_mlp",
        "train.steps=2",
        "train.loggers=mlflow",
        env={"MLFLOW_TRACKING_URI": "nowhere-scheme://store"},
    )
    assert result.returncode != 0
    assert "MLflow could not record the run at nowhere-scheme://store" in result.stderr
    assert "Traceback" not in result.stderr


def test_output_that_is_not_a_terminal_gets_a_line_every_log_every_steps(tmp_path: Path) -> None:
    # train.loggers left at its default (null: TensorBoard where installed)
    result = user_cli(tmp_path, "train", "model=residual_mlp", "train.steps=5", "train.log_every=2")
    assert result.returncode == 0, result.stderr
    (run,) = (p.parent for p in tmp_path.glob("outputs/residual_mlp/*/metrics.jsonl"))
    assert not (run / "trackers.json").exists()  # neither W&B nor MLflow unless named
    steps = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("step ")]
    assert steps == ["2/5", "4/5", "5/5"]  # and the last
    line = next(line for line in result.stdout.splitlines() if line.startswith("step 4/5"))
    for word in ("loss", "lr", "grad_norm", "tok/s"):
        assert word in line


def test_an_unknown_tracker_is_refused_from_python_and_the_command_line(tmp_path: Path) -> None:
    with pytest.raises(ArgumentError, match="'neptune': choose from tensorboard, wandb, mlflow"):
        _train(tmp_path / "run", 2, ["neptune"])
    result = user_cli(tmp_path, "validate", "model=residual_mlp", "train.loggers=[neptune]")
    assert result.returncode == 2 and "train.loggers[0]" in result.stderr and "Traceback" not in result.stderr


def test_the_guides_command_runs_as_written(tmp_path: Path) -> None:
    pytest.importorskip("wandb", reason="the wandb extra")
    pytest.importorskip("mlflow", reason="the mlflow extra")
    (line,) = block_after("guides/training.md", "train.loggers` names", "bash").strip().splitlines()
    words = shlex.split(line)
    env = dict(w.split("=", 1) for w in words[: words.index("python")])
    assert env == {"WANDB_MODE": "offline"}
    result = user_cli(tmp_path, *words[words.index("python") + 3 :], env=env)
    assert result.returncode == 0, result.stderr
    (run,) = (p.parent for p in tmp_path.glob("outputs/residual_mlp/*/trackers.json"))
    assert set(json.loads((run / "trackers.json").read_text())) == {"wandb", "mlflow"}
    assert "W&B run in" in result.stdout and "MLflow run in" in result.stdout
