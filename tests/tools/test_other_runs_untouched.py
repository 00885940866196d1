"""No command writes into a directory another run holds or over files it did not create: a training
run's directory, its checkpoints, or a user's own config.yaml are refused as destinations, before any
work, and left exactly as they were."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SMALL = ["model=residual_mlp", "model.dims.hidden=8", "model.dims.ffn=8"]
QUICK_BENCH = ["bench.repeats=1", "bench.warmup=0", "bench.tokens=16"]


def _cli(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "te_assembly", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("runs")
    done = _cli(
        folder,
        "train",
        *SMALL,
        "train.steps=2",
        "train.batch_tokens=8",
        "train.plot=false",
        "hydra.run.dir=RUN",
    )
    assert done.returncode == 0, done.stderr
    return folder / "RUN"


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["bench", *QUICK_BENCH, "hydra.run.dir={run}"], "bench's run directory never writes into it"),
        (
            ["bench", *QUICK_BENCH, "bench.report={run}/ckpt-0000002.safetensors"],
            "is a checkpoint or weights file",
        ),
        (["bench", *QUICK_BENCH, "bench.report={run}/report.json"], "bench.report never writes into it"),
        (["graph", "graph.out_dir={run}"], "graph never writes into it"),
        (["export", "{run}", "{run}"], "holds a training run"),
        (["export", "{run}", "{run}", "export.format=hf", "export.overwrite=true"], "holds a training run"),
    ],
)
def test_another_runs_directory_is_refused(run: Path, args: list[str], said: str) -> None:
    before = _snapshot(run)
    done = _cli(run.parent, *[a.format(run=run) for a in args], *SMALL)
    assert done.returncode != 0, done.stdout
    assert said in " ".join(done.stderr.split()), done.stderr  # rich may wrap the line
    assert _snapshot(run) == before and not (run / "report.json").exists()


def test_a_users_own_config_yaml_is_never_written_over(tmp_path: Path) -> None:
    mine = tmp_path / "config.yaml"
    mine.write_text("lr: 0.1  # my own notes\n")
    done = _cli(tmp_path, "bench", *QUICK_BENCH, *SMALL, "hydra.run.dir=.")
    assert done.returncode != 0 and "is not a config te_assembly wrote" in " ".join(done.stderr.split())
    assert mine.read_text() == "lr: 0.1  # my own notes\n"
    assert not (tmp_path / "bench.json").exists()
