"""A resume never rolls back and a save never overwrites what it did not write: ``train.resume_from``
an older checkpoint is refused while the run has good checkpoints past it (naming them), and a file
renamed to the name of a later step is never written over."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import te_assembly
from te_assembly.engines.target import Target
from te_assembly.errors import CheckpointError
from te_assembly.formats.checkpoint import list_checkpoints, read_header
from te_assembly.jobs.train.job import train
from te_assembly.jobs.train.settings import TrainSettings


@pytest.fixture(scope="module")
def plan() -> object:
    return te_assembly.load("residual_mlp", ["model.dims.hidden=16", "model.dims.ffn=16"]).checked_plan()


def _settings(out: Path, **kw: object) -> TrainSettings:
    base: dict[str, object] = {
        "steps": 12,
        "batch_tokens": 16,
        "checkpoint_every": 4,
        "keep_checkpoints": 10,
        "plot": False,
        "out_dir": str(out),
    }
    return TrainSettings(**{**base, **kw})  # type: ignore[arg-type]


def _bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix == ".safetensors"}


def test_resume_from_an_older_checkpoint_is_refused_and_touches_nothing(plan: object, tmp_path: Path) -> None:
    out = tmp_path / "run"
    train(plan, Target.of("reference", seed=3), _settings(out))  # type: ignore[arg-type]
    before = _bytes(out)
    older = out / "ckpt-0000004.safetensors"
    with pytest.raises(CheckpointError) as info:
        train(plan, Target.of("reference", seed=3), _settings(out, resume=True, resume_from=str(older)))  # type: ignore[arg-type]
    message = str(info.value)
    assert "ckpt-0000008.safetensors (step 8), ckpt-0000012.safetensors (step 12)" in message
    assert "a resume never rolls back" in message
    assert _bytes(out) == before
    # Branching, as the message says: the older checkpoint copied into a new directory resumes there.
    branch = tmp_path / "branch"
    branch.mkdir()
    shutil.copy(older, branch / older.name)
    resumed = train(plan, Target.of("reference", seed=3), _settings(branch, steps=8, resume=True))  # type: ignore[arg-type]
    assert resumed.start_step == 4 and resumed.last_step == 8
    assert _bytes(out) == before


def test_a_renamed_checkpoint_is_never_written_over(plan: object, tmp_path: Path) -> None:
    out = tmp_path / "run"
    train(plan, Target.of("reference", seed=4), _settings(out, steps=8))  # type: ignore[arg-type]
    # The user renames step 8's checkpoint to the name step 12's would get.
    renamed = out / "ckpt-0000012.safetensors"
    (out / "ckpt-0000008.safetensors").rename(renamed)
    kept = renamed.read_bytes()
    train(plan, Target.of("reference", seed=4), _settings(out, steps=12, resume=True))  # type: ignore[arg-type]
    assert renamed.read_bytes() == kept and read_header(renamed).step == 8
    steps = sorted(read_header(p).step for _, p in list_checkpoints(out))
    assert steps[-1] == 12 and (out / "ckpt-0000012_1.safetensors").is_file()
