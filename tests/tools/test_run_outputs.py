"""Run directories and metrics, as a user meets them: ``python -m te_assembly`` run from a folder outside
the repository, with no output flags. Each run lands in ``outputs/<model>/<date>_<time>/`` with its
resolved ``config.yaml``; ``train`` adds ``metrics.jsonl`` and checkpoints; ``-m`` sweeps land in
Hydra's sweep directory; ``train.resume`` finds the run by directory."""

from __future__ import annotations

import json
import math
import re
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml

from te_assembly.jobs.train.schedule import lr_at
from te_assembly.jobs.train.settings import TrainSettings
from te_assembly.jobs.train.trackers import KINDS
from tests.conftest import REPO_ROOT
from tests.conftest import user_cli as shared_user_cli

STAMP = re.compile(r"^\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}(_\d+)?$")
TINY = ["train.steps=2", "train.batch_tokens=32"]


def user_cli(
    cwd: Path, args: Sequence[str], umask: int = 0o022, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """The CLI in ``cwd`` (not the repository), the package found through PYTHONPATH as an installed one."""
    return shared_user_cli(cwd, *args, umask=umask, timeout=timeout)


def only_run(root: Path, model: str) -> Path:
    runs = sorted((root / "outputs" / model).iterdir())
    assert len(runs) == 1, runs
    assert STAMP.match(runs[0].name), runs[0].name
    return runs[0]


def records(run: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def resolved(run: Path) -> dict:  # type: ignore[type-arg]
    data = yaml.safe_load((run / "config.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_two_models_one_after_the_other_each_in_its_own_run_directory(tmp_path: Path) -> None:
    said = {}
    for model in ("residual_mlp", "two_stage"):
        done = user_cli(tmp_path, ["train", f"model={model}", *TINY], umask=0o002)
        assert done.returncode == 0, done.stderr
        said[model] = done.stdout
    assert sorted(p.name for p in (tmp_path / "outputs").iterdir()) == ["residual_mlp", "two_stage"]
    assert not (tmp_path / "train_out").exists()
    for model in ("residual_mlp", "two_stage"):
        run = only_run(tmp_path, model)
        assert f"run directory: {run}" in said[model]
        config = resolved(run)
        # The fully resolved config: the model as built, the overrides applied, every train setting.
        assert config["model"]["name"] == model
        assert config["train"]["steps"] == 2 and config["train"]["batch_tokens"] == 32
        assert config["train"]["lr"] == TrainSettings().lr  # a default, written out too
        assert [r["step"] for r in records(run)] == [1, 2]
        checkpoints = sorted(run.glob("ckpt-*.safetensors"))
        assert [c.name for c in checkpoints] == ["ckpt-0000002.safetensors"]
        assert (run / "loss_curve.png").read_bytes().startswith(b"\x89PNG")
        # The user's umask (002 here), not 0600: a group can read and write what the run wrote.
        for path in [*checkpoints, run / "config.yaml", run / "metrics.jsonl", run / "loss_curve.png"]:
            assert stat.S_IMODE(path.stat().st_mode) == 0o664, path


def test_metrics_records_every_step(tmp_path: Path) -> None:
    steps = 4
    args = [
        "train",
        "model=moe_block",
        f"train.steps={steps}",
        "train.batch_tokens=32",
        "train.warmup_steps=2",
    ]
    done = user_cli(tmp_path, args)
    assert done.returncode == 0, done.stderr
    run = only_run(tmp_path, "moe_block")
    rows = records(run)
    settings = TrainSettings(steps=steps, batch_tokens=32, warmup_steps=2)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    for r in rows:
        # moe_block's objective has two named terms: the regression and the router's aux loss.
        assert len(r["terms"]) == 2 and any("aux_loss" in name for name in r["terms"]), r["terms"]
        assert math.isclose(r["loss"], sum(r["terms"].values()), rel_tol=1e-5)
        assert math.isclose(r["lr"], lr_at(r["step"], settings), rel_tol=1e-9)
        assert math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0
        assert r["tokens_per_s"] > 0 and r["step_time_s"] > 0
        assert math.isclose(r["tokens_per_s"], 32 / r["step_time_s"], rel_tol=1e-3)
    assert rows[0]["lr"] < rows[1]["lr"]  # warm-up, then decay
    assert [r["elapsed_s"] for r in rows] == sorted(r["elapsed_s"] for r in rows)
    assert rows[0]["wall_time"] <= rows[-1]["wall_time"]
    events = (
        list((run / "tensorboard").glob("events.out.tfevents.*")) if (run / "tensorboard").exists() else []
    )
    if not KINDS["tensorboard"].installed:
        assert events == []  # not installed: nothing, and no error (train.loggers=null)
        refused = user_cli(tmp_path, [*args, "train.loggers=[tensorboard]"])
        assert refused.returncode != 0 and "tensorboard" in refused.stderr
        return
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert len(events) == 1
    accumulator = EventAccumulator(str(events[0]))
    accumulator.Reload()
    tags = accumulator.Tags()["scalars"]
    assert {"loss", "lr", "grad_norm"} <= set(tags), tags
    logged = [(e.step, e.value) for e in accumulator.Scalars("loss")]
    assert [s for s, _ in logged] == list(range(1, steps + 1))
    assert all(math.isclose(v, r["loss"], rel_tol=1e-5) for (_, v), r in zip(logged, rows, strict=True))


def test_resume_finds_the_run_by_directory_and_newest_run(tmp_path: Path) -> None:
    assert user_cli(tmp_path, ["train", "model=residual_mlp", *TINY]).returncode == 0
    run = only_run(tmp_path, "residual_mlp")
    relative = run.relative_to(tmp_path)
    done = user_cli(
        tmp_path,
        ["train", "model=residual_mlp", "train.steps=3", "train.batch_tokens=32", f"train.resume={relative}"],
    )
    assert done.returncode == 0, done.stderr
    assert "resumed from" in done.stdout and "(step 2)" in done.stdout
    # The same directory continues: no second run directory, steps 1-3 in one metrics file.
    assert only_run(tmp_path, "residual_mlp") == run
    assert [r["step"] for r in records(run)] == [1, 2, 3]
    assert (run / "ckpt-0000003.safetensors").exists()
    # train.resume=true: this model's newest run with checkpoints.
    done = user_cli(
        tmp_path,
        ["train", "model=residual_mlp", "train.steps=4", "train.batch_tokens=32", "train.resume=true"],
    )
    assert done.returncode == 0, done.stderr
    assert only_run(tmp_path, "residual_mlp") == run
    assert [r["step"] for r in records(run)] == [1, 2, 3, 4]
    assert resolved(run)["train"]["steps"] == 4


def test_a_sweep_lands_in_hydras_sweep_directory(tmp_path: Path) -> None:
    done = user_cli(
        tmp_path, ["train", "-m", "model=residual_mlp,two_stage", "train.steps=1", "train.batch_tokens=32"]
    )
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "outputs").exists()
    jobs = sorted(p for p in (tmp_path / "multirun").glob("*/*/*") if p.is_dir())
    assert [p.name for p in jobs] == ["0_residual_mlp", "1_two_stage"]
    for job, model in zip(jobs, ("residual_mlp", "two_stage"), strict=True):
        assert resolved(job)["model"]["name"] == model
        assert [r["step"] for r in records(job)] == [1]
        assert (job / "ckpt-0000001.safetensors").exists()


@pytest.mark.te
def test_verify_writes_into_a_run_dir(tmp_path: Path) -> None:
    done = user_cli(tmp_path, ["verify", "model=residual_mlp"])
    assert done.returncode == 0, done.stderr
    run = only_run(tmp_path, "residual_mlp")
    assert {"config.yaml", "verify.json"} <= {p.name for p in run.iterdir()}


def test_graph_and_an_overridden_run_dir(tmp_path: Path) -> None:
    # Two configs whose YAML says the same name: the files follow the config chosen, so neither is lost.
    source = (REPO_ROOT / "configs" / "model" / "two_stage.yaml").read_text()
    for stem in ("first", "second"):
        (tmp_path / f"{stem}.yaml").write_text(source)
        done = user_cli(tmp_path, ["graph", f"model={stem}.yaml", "graph.formats=[mermaid]"])
        assert done.returncode == 0, done.stderr
        run = only_run(tmp_path, stem)
        assert sorted(p.name for p in run.iterdir()) == ["config.yaml", f"{stem}.mmd"]
        assert resolved(run)["model"]["name"] == "two_stage"
    done = user_cli(tmp_path, ["graph", "model=two_stage", "graph.formats=[dot]", "hydra.run.dir=pics/here"])
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "pics" / "here").iterdir()) == ["config.yaml", "two_stage.dot"]
    assert not (tmp_path / "outputs" / "two_stage").exists()


def test_a_run_that_fails_validation_leaves_no_folder(tmp_path: Path) -> None:
    done = user_cli(tmp_path, ["train", "model=residual_mlp", "model.ops.2.args.in_features=7"])
    assert done.returncode == 2
    assert not (tmp_path / "outputs").exists()


def test_a_refused_run_removes_the_run_directory_it_named_but_not_one_that_was_there(tmp_path: Path) -> None:
    bad = ["train", "model=residual_mlp", "model.ops.2.args.in_features=7"]
    done = user_cli(tmp_path, [*bad, "hydra.run.dir=runs/a/b"])
    assert done.returncode == 2
    assert not (tmp_path / "runs").exists()  # made for the job, with its parents, and removed again
    (tmp_path / "mine").mkdir()
    done = user_cli(tmp_path, [*bad, "hydra.run.dir=mine"])
    assert done.returncode == 2 and (tmp_path / "mine").is_dir()  # the user's own folder stays


@pytest.mark.parametrize("command", ["validate", "explain"])
def test_commands_that_write_nothing_make_no_run_directory(tmp_path: Path, command: str) -> None:
    done = user_cli(tmp_path, [command, "model=residual_mlp"])
    assert done.returncode == 0, done.stderr
    assert list(tmp_path.iterdir()) == []
