"""Ctrl-C and SIGTERM stop ``train`` in order: it says which checkpoint the run keeps and the command
that continues it, and that command does."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ARGS = [
    "model=residual_mlp",
    "model.dims.hidden=8",
    "model.dims.ffn=8",
    "train.batch_tokens=8",
    "train.plot=false",
    "train.checkpoint_every=2",
    "train.steps=100000",
]


@pytest.mark.parametrize(
    ("sig", "code", "word"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
def test_an_interrupted_run_says_what_it_keeps_and_how_to_continue(
    tmp_path: Path, sig: signal.Signals, code: int, word: str
) -> None:
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb"}
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "te_assembly", "train", *ARGS, f"hydra.run.dir={run}"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not list(run.glob("ckpt-*.safetensors")) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, out + err
    assert word in err and "Traceback" not in err
    line = next(x for x in out.splitlines() if x.startswith("stopped: the run keeps"))
    assert str(run) in line and "verified" in line
    command = out.splitlines()[out.splitlines().index(line) + 1].strip()
    assert command.startswith("python -m te_assembly train") and f"train.resume={run}" in command
    again = shlex.split(command)[4:]  # after "python -m te_assembly train"
    again = [a if not a.startswith("train.steps=") else "train.steps=2000000" for a in again]
    resumed = subprocess.run(
        [sys.executable, "-m", "te_assembly", "train", *again, "train.stop_after=1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "resumed from" in resumed.stdout or "nothing to do" in resumed.stdout, (
        resumed.stdout + resumed.stderr
    )
