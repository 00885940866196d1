"""A FIFO (or any non-regular file) where te_assembly expects a file it reads or appends to is refused
by name, at once: opening a FIFO for reading would wait for a writer forever."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SMALL = [
    "model=residual_mlp",
    "model.dims.hidden=8",
    "model.dims.ffn=8",
    "train.batch_tokens=8",
    "train.plot=false",
]


def _cli(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "te_assembly", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("name", ["metrics.jsonl", ".te_assembly.lock"])
def test_a_fifo_in_a_run_directory_is_refused_not_waited_on(tmp_path: Path, name: str) -> None:
    run = tmp_path / "run"
    done = _cli(tmp_path, "train", *SMALL, "train.steps=2", f"hydra.run.dir={run}")
    assert done.returncode == 0, done.stderr
    (run / name).unlink(missing_ok=True)  # a finished run leaves no lock file
    os.mkfifo(run / name)
    again = _cli(tmp_path, "train", *SMALL, "train.steps=3", "train.resume=true", f"hydra.run.dir={run}")
    assert again.returncode == 1, again.stdout + again.stderr
    assert f"{run / name} is a FIFO (named pipe)" in again.stderr


@pytest.mark.parametrize("group", ["model", "recipe"])
def test_a_fifo_as_a_config_file_is_named(tmp_path: Path, group: str) -> None:
    pipe = tmp_path / "pipe.yaml"
    os.mkfifo(pipe)
    done = _cli(tmp_path, "validate", f"{group}={pipe}")
    assert done.returncode == 2
    assert f"{group} file {pipe} is a FIFO (named pipe), not a {group} file" in done.stderr
