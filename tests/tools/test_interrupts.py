"""Ctrl-C and SIGTERM stop ``train`` in order: it says which checkpoint the run keeps and the command
that continues it, and that command does."""

from __future__ import annotations

import io
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

ARGS = [
    "model=residual_mlp",
    "model.dims.hidden=8",
    "model.dims.ffn=8",
    "train.batch_tokens=8",
    "train.plot=false",
    "train.checkpoint_every=2",
    "train.steps=100000",
]
ENV = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb"}


@pytest.fixture(autouse=True)
def ctrl_c_as_on_a_terminal() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt, as when Python starts on a terminal, whatever disposition this
    pytest inherited: one started in the background has SIGINT ignored, which train keeps on purpose
    (``test_a_signal_the_parent_ignores_stays_ignored``, which sets it itself)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def _as_on_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a child's Python then installs its own handler


def _continues(folder: Path, out: str, run: Path) -> None:
    """The printed command is there, names the run, and continues it."""
    lines = out.splitlines()
    line = next(x for x in lines if x.startswith("stopped: the run keeps"))
    assert str(run) in line and "verified" in line
    command = lines[lines.index(line) + 1].strip()
    assert command.startswith("python -m te_assembly train") and f"train.resume={run}" in command
    again = [a for a in shlex.split(command)[4:] if not a.startswith("train.steps=")]  # after "... train"
    resumed = subprocess.run(
        [sys.executable, "-m", "te_assembly", "train", *again, "train.steps=2000000", "train.stop_after=1"],
        cwd=folder,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed from" in resumed.stdout or "nothing to do" in resumed.stdout, resumed.stdout


def _steps_done(run: Path) -> int:
    metrics = run / "metrics.jsonl"
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


def test_sigterm_says_what_the_run_keeps_and_how_to_continue(tmp_path: Path) -> None:
    run = tmp_path / "run"
    out_file, err_file = tmp_path / "out.txt", tmp_path / "err.txt"
    with out_file.open("w") as out, err_file.open("w") as err:  # files, not pipes: nothing can fill up
        proc = subprocess.Popen(
            [sys.executable, "-m", "te_assembly", "train", *ARGS, f"hydra.run.dir={run}"],
            cwd=tmp_path,
            env=ENV,
            stdout=out,
            stderr=err,
            text=True,
            preexec_fn=_as_on_a_terminal,
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and _steps_done(run) < 4:
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=300)
    assert proc.returncode == 143, out_file.read_text() + err_file.read_text()
    assert "terminated" in err_file.read_text() and "Traceback" not in err_file.read_text()
    _continues(tmp_path, out_file.read_text(), run)


def test_ctrl_c_says_what_the_run_keeps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C (KeyboardInterrupt) after the run has checkpoints, in process: the same report."""
    from te_assembly.cli import main as cli
    from te_assembly.jobs.train.loop import Loop

    real = Loop._checkpoint

    def interrupted(self: Loop, settings: Any, step: int) -> None:
        real(self, settings, step)
        if step == 4:
            raise KeyboardInterrupt  # Ctrl-C once step 4's checkpoint is written

    monkeypatch.setattr(Loop, "_checkpoint", interrupted)
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    buffer = io.StringIO()
    monkeypatch.setattr(cli, "consoles", lambda: _consoles(buffer))
    code = cli.main(["train", *ARGS, f"hydra.run.dir={run}"])
    assert code == 130
    text = buffer.getvalue()
    assert "interrupted" in text
    _continues(tmp_path, text, run)


def _consoles(buffer: io.StringIO) -> Any:
    from te_assembly.cli.app import Consoles

    console = Console(file=buffer, width=400, no_color=True, highlight=False, force_terminal=False)
    return Consoles(console, console)


def _signalled_during_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: int, times: int
) -> tuple[int, str]:
    """Train in process; while step 4's checkpoint is being written, ``signum`` arrives ``times``
    times. Returns the exit code and what was printed."""
    from te_assembly.cli import main as cli
    from te_assembly.formats import checkpoint as parallel_checkpoint

    real = parallel_checkpoint.save

    def save(par: Any, out_dir: Path, step: int, *args: Any, **kwargs: Any) -> Any:
        if step == 4:
            for _ in range(times):
                os.kill(os.getpid(), signum)
                time.sleep(0.05)  # the handler runs at the next bytecode: here, mid-"write"
        return real(par, out_dir, step, *args, **kwargs)

    monkeypatch.setattr(parallel_checkpoint, "save", save)
    monkeypatch.chdir(tmp_path)
    buffer = io.StringIO()
    monkeypatch.setattr(cli, "consoles", lambda: _consoles(buffer))
    args = [a for a in ARGS if not a.startswith("train.steps=")]
    code = cli.main(["train", *args, "train.steps=8", f"hydra.run.dir={tmp_path / 'run'}"])
    return code, buffer.getvalue()


@pytest.mark.parametrize(
    ("signum", "code", "word"), [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")]
)
def test_a_signal_during_a_checkpoint_write_waits_for_the_step_to_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: int, code: int, word: str
) -> None:
    """A stop raised mid-write could surface as torch's or safetensors' own error (CI saw a ValueError
    for SIGTERM): the step, its checkpoint included, ends first, and that checkpoint is the one kept."""
    got, text = _signalled_during_checkpoint(tmp_path, monkeypatch, signum, times=1)
    assert got == code, text
    assert word in text and "unexpected" not in text
    assert "(step 4, verified)" in text, text
    records = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(records) == 4  # step 5 never started
    assert (
        signal.getsignal(signal.SIGTERM) is not None
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    )


def test_a_second_signal_stops_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """For a step that hangs: the second SIGTERM does not wait, so step 4's checkpoint is never written."""
    got, text = _signalled_during_checkpoint(tmp_path, monkeypatch, signal.SIGTERM, times=2)
    assert got == 143, text
    assert "(step 2, verified)" in text, text


def test_a_signal_the_parent_ignores_stays_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shell's background job (or nohup) ignores SIGINT: train must not start stopping on it."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        got, text = _signalled_during_checkpoint(tmp_path, monkeypatch, signal.SIGINT, times=2)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
    assert got == 0, text
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 8


def test_these_tests_hold_when_pytest_starts_with_ctrl_c_ignored(tmp_path: Path) -> None:
    """A background pytest (``pytest &`` in a script) inherits SIGINT ignored: the tests above set what
    they need themselves."""
    here = Path(__file__)

    def ignored() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(here),
            "-k",
            "during_a_checkpoint",
        ],
        cwd=here.parents[2],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=ignored,
    )
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout + done.stderr
