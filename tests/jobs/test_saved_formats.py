"""Files written before the jobs layout still load: the formats on disk name what they are, not the
module that writes them. ``tests/configs/saved/`` holds a pretrained directory and a training
checkpoint written by te_assembly 0.1.0 as it was before the move."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

import te_assembly
from te_assembly.formats.checkpoint import model_state, read_meta

SAVED = Path(__file__).resolve().parents[1] / "configs" / "saved"


def test_an_earlier_pretrained_directory_loads() -> None:
    model = te_assembly.from_pretrained(SAVED / "pretrained_v0", "reference")
    assert model.plan.name == "residual_mlp" and model.plan.in_features == 8
    assert next(model.parameters()).dtype == torch.float64
    y, _ = model(torch.ones(2, 8, dtype=torch.float64))
    assert y.shape == (2, 8) and bool(torch.isfinite(y).all())


def test_an_earlier_training_checkpoint_reads_and_exports(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(SAVED / "run_v0", run)
    checkpoint = run / "ckpt-0000002.safetensors"
    assert read_meta(checkpoint)["step"] == 2
    _, weights = model_state(checkpoint)
    out = te_assembly.export_checkpoint(run, tmp_path / "exported")
    model = te_assembly.from_pretrained(out, "reference")
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items() if k in weights)
