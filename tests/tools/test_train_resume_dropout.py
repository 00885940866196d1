"""Resume with dropout in training mode: only an exact restore of the RNG gives back the same run.

Without dropout, a resume that forgot the RNG state would still reproduce every loss (the teacher
task's batches come from their own per-step generator), so the resume tests in ``test_train.py`` could
not see it. Here the student's dropout masks come from torch's global RNG, which ``train`` reseeds
before it builds the model: a resumed run only matches when the checkpoint's RNG state is restored.
Written against the public ``train()`` API and the CLI, not the checkpoint format.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

import pytest
import torch

from te_assembly.cli.main import main as cli_main
from te_assembly.engines.target import Target
from te_assembly.jobs.events import only
from te_assembly.jobs.train.job import train
from te_assembly.jobs.train.result import StepRecord
from te_assembly.jobs.train.settings import TrainSettings
from tests.engines._helpers import plan_from_yaml

DROPOUT_MLP = """
name: dropout_mlp
in_features: 8
ops:
  - name: fc1
    op: Linear
    args: {in_features: 8, out_features: 16}
  - name: drop
    op: Dropout
    args: {p: 0.3}
  - name: fc2
    op: Linear
    args: {in_features: 16, out_features: 8}
  - name: drop_module        # a torch.nn.Dropout module draws from the same RNG
    module: Dropout
    args: {p: 0.2}
  - name: fc3
    op: Linear
    args: {in_features: 8, out_features: 8}
"""

STEPS, STOP = 10, 5


def _settings(out: Path, **kw: object) -> TrainSettings:
    base: dict[str, object] = {
        "steps": STEPS,
        "batch_tokens": 16,
        "warmup_steps": 2,
        "checkpoint_every": 3,  # the stop (step 5) is not on the checkpoint grid: resume from step 5
        "keep_checkpoints": 5,
        "plot": False,
        "out_dir": str(out),
    }
    return TrainSettings(**{**base, **kw})  # type: ignore[arg-type]


ENGINES = [
    pytest.param("reference", "te", id="reference"),
    pytest.param("te", "reference", id="te-kernels-reference", marks=pytest.mark.te),
]


@pytest.mark.parametrize(("engine", "kernels"), ENGINES)
def test_resume_with_dropout_is_bit_identical(tmp_path: Path, engine: str, kernels: str) -> None:
    plan = plan_from_yaml(DROPOUT_MLP)
    run = Target.of(engine, kernels=kernels, seed=3)
    full = train(plan, run, _settings(tmp_path / "full"))
    part_settings = _settings(tmp_path / "part", stop_after=STOP)
    part = train(plan, run, part_settings)
    assert part.losses == full.losses[:STOP]
    torch.manual_seed(12345)  # whatever state the process is in, the resume must not depend on it
    torch.rand(1000)
    resumed = train(plan, run, dataclasses.replace(part_settings, stop_after=None, resume=True))
    assert resumed.start_step == STOP
    assert resumed.losses == full.losses  # exact, float for float
    assert full.model is not None and resumed.model is not None
    want, got = full.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want), "final weights differ"


@pytest.mark.parametrize(("engine", "kernels"), ENGINES)
def test_the_dropout_masks_change_the_losses(tmp_path: Path, engine: str, kernels: str) -> None:
    """The resume test above can fail: from step STOP + 1 on, a run whose RNG is put anywhere else
    (a resume that did not restore it starts from the state right after building the model) draws
    other dropout masks and other losses."""
    plan = plan_from_yaml(DROPOUT_MLP)
    run = Target.of(engine, kernels=kernels, seed=3)
    full = train(plan, run, _settings(tmp_path / "full")).losses

    def reseed_after_stop(record: StepRecord) -> None:
        if record.step == STOP:
            torch.manual_seed(3)

    other = train(
        plan, run, _settings(tmp_path / "other"), on_event=only(StepRecord, reseed_after_stop)
    ).losses
    assert other[:STOP] == full[:STOP]
    assert all(a != b for a, b in zip(other[STOP:], full[STOP:], strict=True)), (other, full)


HIDDEN = ["model.dims.hidden=8", "model.dims.ffn=8"]
# residual_mlp with its LayerNorm replaced by a Dropout op, through Hydra overrides only.
WITH_DROPOUT = [
    "model=residual_mlp",
    *HIDDEN,
    "model.ops.1.name=drop",
    "model.ops.1.op=Dropout",
    "~model.ops.1.args",
    "+model.ops.1.args={p:0.3}",
]


def _train_args(out: Path, *extra: str) -> list[str]:
    args = ["train", *WITH_DROPOUT, "engine=reference", "seed=5", f"train.out_dir={out}"]
    return [
        *args,
        "train.steps=8",
        "train.batch_tokens=16",
        "train.checkpoint_every=3",
        "train.plot=false",
        *extra,
    ]


def _losses(out: Path) -> list[float]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [float(json.loads(line)["loss"]) for line in lines]


def test_cli_resume_in_a_new_process_with_dropout(
    run_cli: Callable[..., CompletedProcess[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    assert cli_main(_train_args(tmp_path / "full")) == 0
    assert cli_main(_train_args(tmp_path / "part", "train.stop_after=4")) == 0
    assert _losses(tmp_path / "part") == _losses(tmp_path / "full")[:4]
    result = run_cli(_train_args(tmp_path / "part", "train.resume=true"))  # a fresh process
    assert result.returncode == 0, result.stderr
    # A run that silently started over would give the same losses: the resume itself is shown.
    assert re.search(r"resumed from \S*ckpt-0*4\b", result.stdout), result.stdout
    assert _losses(tmp_path / "part") == _losses(tmp_path / "full")
