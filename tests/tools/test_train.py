"""Training on the teacher task: the loss falls, resume is exact, NaNs stop the run with the step and
tensor, and checkpoints are never half-written."""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path

import pytest
import torch

import te_assembly
from te_assembly.analysis.pipeline import load
from te_assembly.analysis.plan import Plan
from te_assembly.cli.main import main as cli_main
from te_assembly.engines import build
from te_assembly.engines.target import Target
from te_assembly.errors import ConfigError, ExistingRunError, NonFiniteError
from te_assembly.formats.checkpoint import (
    CheckpointError,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from te_assembly.formats.checkpoint import file as ckpt_module
from te_assembly.jobs.events import only
from te_assembly.jobs.train.job import train
from te_assembly.jobs.train.lock import LOCK_NAME
from te_assembly.jobs.train.result import StepRecord
from te_assembly.jobs.train.schedule import lr_at, make_optimizer
from te_assembly.jobs.train.settings import TrainSettings

SMALL = ["model=residual_mlp", "model.dims.hidden=16", "model.dims.ffn=32"]


@pytest.fixture(scope="module")
def small_plan() -> Plan:
    plan = load(None, SMALL).plan
    assert plan is not None
    return plan


def _settings(out: Path, **kw: object) -> TrainSettings:
    base = {
        "steps": 12,
        "batch_tokens": 32,
        "warmup_steps": 2,
        "checkpoint_every": 4,
        "keep_checkpoints": 10,
        "plot": False,
        "out_dir": str(out),
    }
    base.update(kw)
    return TrainSettings(**base)  # type: ignore[arg-type]


def test_loss_decreases_on_the_teacher_task(small_plan: Plan, tmp_path: Path) -> None:
    s = _settings(tmp_path, steps=60, batch_tokens=64, lr=3e-3, warmup_steps=5, plot=True)
    result = te_assembly.train(small_plan, Target.of("reference", seed=0), s)  # the job, then its picture
    losses = result.losses
    assert len(losses) == 60 and all(math.isfinite(v) for v in losses)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.8 * first, (first, last)
    assert result.plot is not None and result.plot.read_bytes()[:4] == b"\x89PNG"


def test_stop_and_resume_matches_an_uninterrupted_run(small_plan: Plan, tmp_path: Path) -> None:
    full = train(small_plan, Target.of("reference", seed=5), _settings(tmp_path / "full")).losses
    part_settings = _settings(tmp_path / "part", stop_after=6)
    part = train(small_plan, Target.of("reference", seed=5), part_settings)
    assert part.last_step == 6 and part.losses == full[:6]
    resumed = train(
        small_plan,
        Target.of("reference", seed=5),
        dataclasses.replace(part_settings, stop_after=None, resume=True),
    )
    assert resumed.start_step == 6
    assert resumed.losses == full  # exact: same data stream, optimizer state and RNG


def test_crash_after_a_step_then_resume_matches(small_plan: Plan, tmp_path: Path) -> None:
    full = train(
        small_plan,
        Target.of("reference", seed=1),
        _settings(tmp_path / "full", optimizer="sgd", schedule="constant"),
    ).losses
    s = _settings(tmp_path / "crash", optimizer="sgd", schedule="constant")

    class Crash(Exception):
        pass

    def crash_at_7(record: StepRecord) -> None:
        if record.step == 7:
            raise Crash

    with pytest.raises(Crash):
        train(small_plan, Target.of("reference", seed=1), s, on_event=only(StepRecord, crash_at_7))
    assert [step for step, _ in list_checkpoints(tmp_path / "crash")] == [4]
    resumed = train(small_plan, Target.of("reference", seed=1), dataclasses.replace(s, resume=True))
    assert resumed.start_step == 4 and resumed.losses == full


@pytest.mark.parametrize(("into", "tensor"), [("loss", "loss"), ("grad", "grad of steps.")])
def test_forced_nan_names_step_and_tensor(small_plan: Plan, tmp_path: Path, into: str, tensor: str) -> None:
    with pytest.raises(NonFiniteError) as info:
        train(
            small_plan,
            Target.of("reference", seed=0),
            _settings(tmp_path, inject_nan_at_step=3, inject_nan_into=into),
        )
    assert info.value.step == 3
    assert info.value.tensor.startswith(tensor)
    assert [step for step, _ in list_checkpoints(tmp_path)] == []  # stopped before step 4's checkpoint


def test_cli_reports_nan_with_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    rc = cli_main(
        [
            "train",
            *SMALL,
            "train.steps=10",
            "train.batch_tokens=16",
            "train.plot=false",
            "train.inject_nan_at_step=4",
            f"train.out_dir={tmp_path}",
            "engine=reference",
        ]
    )
    assert rc == 1
    assert "step 4" in capsys.readouterr().err


def test_cli_train_rejects_bad_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    rc = cli_main(["train", *SMALL, "train.optimizer=adam", "train.steps=0", f"train.out_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "train.optimizer" in err and "train.steps" in err
    with pytest.raises(ConfigError, match="did you mean 'steps'"):
        TrainSettings.from_mapping({"stepz": 3})


def _interrupted_write(tensors: dict[str, torch.Tensor], filename: str, metadata: dict[str, str]) -> None:
    # What a crash or a full disk in the middle of serialization leaves: some bytes, then an error.
    with open(filename, "wb") as f:
        f.write(b"\x00" * 100)
    raise OSError("simulated crash while writing the checkpoint")


def test_checkpoint_write_is_atomic(
    small_plan: Plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = _settings(tmp_path, steps=8)
    full = train(small_plan, Target.of("reference", seed=2), s).losses
    before = {p.name: p.read_bytes() for _, p in list_checkpoints(tmp_path)}
    assert sorted(before) == ["ckpt-0000004.safetensors", "ckpt-0000008.safetensors"]

    torch.manual_seed(0)
    model = build(small_plan, "reference")
    optimizer = make_optimizer(model.parameters(), s)
    monkeypatch.setattr(ckpt_module, "save_file", _interrupted_write)
    # The OS error surfaces as a typed CheckpointError (a message, not a traceback, in the CLI).
    with pytest.raises(CheckpointError, match="simulated crash") as info:
        save_checkpoint(tmp_path, 12, model, optimizer, {"plan": small_plan.name})
    assert isinstance(info.value.__cause__, OSError)
    run_files = (LOCK_NAME, "metrics.jsonl", "tensorboard")
    left = sorted(p.name for p in tmp_path.iterdir() if p.name not in run_files)
    assert left == sorted(before)
    assert {p.name: p.read_bytes() for _, p in list_checkpoints(tmp_path)} == before

    # The surviving checkpoint loads, and resuming from it reproduces the run.
    loaded = load_checkpoint(tmp_path / "ckpt-0000008.safetensors", model, optimizer)
    assert loaded.step == 8 and "losses" not in loaded.meta  # the history is metrics.jsonl's
    monkeypatch.undo()
    (tmp_path / "ckpt-0000004.safetensors").rename(tmp_path / "keep4")
    (tmp_path / "ckpt-0000008.safetensors").unlink()
    (tmp_path / "keep4").rename(tmp_path / "ckpt-0000004.safetensors")
    resumed = train(small_plan, Target.of("reference", seed=2), dataclasses.replace(s, resume=True))
    assert resumed.start_step == 4 and resumed.losses == full


def test_crash_mid_write_during_training_then_resume(
    small_plan: Plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = _settings(tmp_path, steps=12)
    full = train(small_plan, Target.of("reference", seed=4), _settings(tmp_path / "full", steps=12)).losses
    real_save = ckpt_module.save_file

    def fail_at_step_8(tensors: dict[str, torch.Tensor], filename: str, metadata: dict[str, str]) -> None:
        if metadata["step"] == "8":
            _interrupted_write(tensors, filename, metadata)
        real_save(tensors, filename, metadata=metadata)

    monkeypatch.setattr(ckpt_module, "save_file", fail_at_step_8)
    with pytest.raises(CheckpointError, match="ckpt-0000008"):
        train(small_plan, Target.of("reference", seed=4), s)
    monkeypatch.undo()
    assert [step for step, _ in list_checkpoints(tmp_path)] == [4]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    # A temp file left by a hard kill (no cleanup ran) is never loaded, and is removed on resume.
    stale = tmp_path / ".ckpt-0000012.safetensors.x1y2.tmp"
    stale.write_bytes(b"garbage")
    resumed = train(small_plan, Target.of("reference", seed=4), dataclasses.replace(s, resume=True))
    assert resumed.start_step == 4 and resumed.losses == full
    assert not stale.exists()


def test_schedule_warmup_and_cosine_floor() -> None:
    s = TrainSettings(steps=100, lr=1.0, warmup_steps=10, min_lr_ratio=0.1, schedule="cosine")
    assert lr_at(5, s) == pytest.approx(0.5)
    assert lr_at(10, s) == pytest.approx(1.0)
    assert lr_at(100, s) == pytest.approx(0.1)
    values = [lr_at(k, s) for k in range(10, 101)]
    assert all(a >= b for a, b in itertools.pairwise(values))
    constant = dataclasses.replace(s, schedule="constant")
    assert lr_at(100, constant) == pytest.approx(1.0)


def test_teacher_differs_even_where_init_is_deterministic(tmp_path: Path) -> None:
    # channel_demo has only zero-initialised biases: without perturbing them the task would be solved.
    result = train(
        load("channel_demo").checked_plan(), Target.of("reference", seed=0), _settings(tmp_path, steps=2)
    )
    assert result.losses[0] > 1e-4


RENAMED_AUX = [
    "model=moe_block",
    "model.dims.hidden=16",
    "model.dims.ffn=8",
    "model.ops.2.extra_outputs.aux_loss.channel=balance",
]


def test_aux_loss_joins_the_objective_whatever_its_channel_is_called(tmp_path: Path) -> None:
    plan = load(None, RENAMED_AUX).plan
    assert plan is not None and [t.name for t in plan.public_outputs] == ["balance"]
    records: list[StepRecord] = []
    train(
        plan,
        Target.of("reference", seed=0),
        _settings(tmp_path, steps=2, batch_tokens=16),
        on_event=only(StepRecord, records.append),
    )
    assert [sorted(r.terms) for r in records] == [["balance", "mse(y, teacher)"]] * 2
    for r in records:
        assert r.terms["balance"] > 0
        assert r.loss == pytest.approx(sum(r.terms.values()), rel=1e-6)


def _checkpoint_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for _, p in list_checkpoints(out)}


def test_fresh_run_refuses_an_earlier_runs_checkpoints(small_plan: Plan, tmp_path: Path) -> None:
    s = _settings(tmp_path, steps=6)
    train(small_plan, Target.of("reference", seed=0), s)
    before = _checkpoint_bytes(tmp_path)
    assert sorted(before) == ["ckpt-0000004.safetensors", "ckpt-0000006.safetensors"]
    with pytest.raises(ExistingRunError) as info:
        train(
            small_plan, Target.of("reference", seed=0), dataclasses.replace(s, lr=1e-2)
        )  # forgot train.resume=true
    assert str(info.value) == (
        f"{tmp_path} already holds checkpoints up to step 6; pass train.resume=true to continue "
        "or train.overwrite=true to start over"
    )
    assert _checkpoint_bytes(tmp_path) == before


def test_overwrite_starts_over(small_plan: Plan, tmp_path: Path) -> None:
    s = _settings(tmp_path / "a", steps=6)
    train(small_plan, Target.of("reference", seed=0), s)
    fresh = train(
        small_plan, Target.of("reference", seed=0), _settings(tmp_path / "b", steps=4, lr=1e-2)
    ).losses
    again = train(
        small_plan, Target.of("reference", seed=0), dataclasses.replace(s, steps=4, lr=1e-2, overwrite=True)
    )
    assert again.start_step == 0 and again.losses == fresh
    assert [step for step, _ in list_checkpoints(tmp_path / "a")] == [4]  # step 6 of the old run is gone
    assert any("removed 2 checkpoint(s)" in note for note in again.notes)


def test_resume_and_overwrite_together_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"train\.resume and train\.overwrite are both true"):
        _settings(tmp_path, resume=True, overwrite=True)
    with pytest.raises(ConfigError, match=r"^1 config error.*\n  .*train\.overwrite"):
        TrainSettings.from_mapping({"resume": True, "overwrite": True})


def test_resume_refuses_other_run_settings_and_lists_each(small_plan: Plan, tmp_path: Path) -> None:
    s = _settings(tmp_path, steps=6, stop_after=4)
    train(small_plan, Target.of("reference", seed=3), s)
    before = _checkpoint_bytes(tmp_path)
    changed = dataclasses.replace(
        s, resume=True, stop_after=None, optimizer="sgd", lr=1e-2, batch_tokens=16, teacher_seed_offset=7
    )
    with pytest.raises(CheckpointError) as info:
        train(small_plan, Target.of("reference", seed=4, dtype=torch.float64), changed)
    message = str(info.value)
    for line in (
        "seed: checkpoint 3, now 4",
        "dtype: checkpoint 'float32', now 'float64'",
        "optimizer: checkpoint 'adamw', now 'sgd'",
        "lr: checkpoint 0.003, now 0.01",
        "batch_tokens: checkpoint 32, now 16",
        "teacher_seed_offset: checkpoint 1, now 7",
    ):
        assert f"\n  {line}\n" in message, message
    assert message.count("\n  ") == 6  # nothing else is reported as changed
    assert _checkpoint_bytes(tmp_path) == before


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("weight_decay", 0.1),
        ("momentum", 0.5),
        ("schedule", "constant"),
        ("warmup_steps", 3),
        ("min_lr_ratio", 0.5),
    ],
)
def test_resume_refuses_each_optimizer_and_schedule_setting(
    small_plan: Plan, tmp_path: Path, key: str, value: object
) -> None:
    s = _settings(tmp_path, steps=4, stop_after=2, checkpoint_every=2)
    train(small_plan, Target.of("reference", seed=0), s)
    with pytest.raises(CheckpointError, match=rf"\n  {key}: checkpoint .*, now {value!r}\n"):
        train(small_plan, Target.of("reference", seed=0), dataclasses.replace(s, resume=True, **{key: value}))  # type: ignore[arg-type]


def test_resume_refuses_another_model(small_plan: Plan, tmp_path: Path) -> None:
    s = _settings(tmp_path, steps=2)
    train(load("channel_demo").checked_plan(), Target.of("reference", seed=0), s)
    with pytest.raises(
        CheckpointError, match=rf"\n  plan: checkpoint 'channel_demo', now '{small_plan.name}'"
    ):
        train(small_plan, Target.of("reference", seed=0), dataclasses.replace(s, resume=True))


def test_resume_may_change_steps_and_bookkeeping(small_plan: Plan, tmp_path: Path) -> None:
    s = _settings(tmp_path, steps=8, stop_after=4)
    train(small_plan, Target.of("reference", seed=0), s)
    resumed = train(
        small_plan,
        Target.of("reference", seed=0),
        dataclasses.replace(
            s, resume=True, steps=10, stop_after=None, checkpoint_every=3, keep_checkpoints=1
        ),
    )
    assert resumed.start_step == 4 and resumed.last_step == 10
    assert any("planned 8 steps, this one 10" in note for note in resumed.notes)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [10]


def test_cli_refuses_to_train_over_an_earlier_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    args = ["train", *SMALL, "train.steps=2", "train.batch_tokens=16", "train.plot=false", "engine=reference"]
    assert cli_main([*args, f"train.out_dir={tmp_path}"]) == 0
    before = _checkpoint_bytes(tmp_path)
    capsys.readouterr()
    assert cli_main([*args, f"train.out_dir={tmp_path}"]) == 1
    captured = capsys.readouterr()
    assert "already holds checkpoints up to step 2; pass train.resume=true" in captured.err
    assert "regress a teacher" not in captured.out  # refused before the run header and progress bar
    assert _checkpoint_bytes(tmp_path) == before
    assert cli_main([*args, f"train.out_dir={tmp_path}", "train.overwrite=true"]) == 0
