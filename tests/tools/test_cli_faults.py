"""Faults no check foresaw still end in one line and exit 1, never a traceback (unless asked for)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rich.console import Console

from te_assembly.analysis.analyze import Analysis
from te_assembly.cli import main as cli


def _failing(exc: Exception):  # type: ignore[no-untyped-def]
    def main(analysis: Analysis, console: Console) -> int:
        raise exc

    return main


@pytest.mark.parametrize(
    ("exc", "line"),
    [
        (
            RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail"),
            "out of memory: CUDA out of",
        ),
        (
            RuntimeError("[enforce fail at alloc_cpu.cpp:118] can't allocate memory: 10 bytes"),
            "out of memory: ",
        ),
        (MemoryError(), "out of memory: MemoryError"),
        (OSError(28, "No space left on device", "/data/x"), "No space left on device (/data/x)"),
        (ValueError("something nobody checked"), "unexpected ValueError: something nobody checked"),
    ],
)
def test_an_unforeseen_fault_is_one_line_and_exit_1(
    exc: Exception, line: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import te_assembly.cli.commands.run as run_command

    monkeypatch.setattr(run_command, "main", _failing(exc))
    monkeypatch.delenv("TE_ASSEMBLY_TRACEBACK", raising=False)
    assert cli.main(["run"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {line}") and err.count("\n") == 1 and "Traceback" not in err


def test_the_traceback_is_there_when_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    import te_assembly.cli.commands.run as run_command

    monkeypatch.setattr(run_command, "main", _failing(ValueError("boom")))
    monkeypatch.setenv("TE_ASSEMBLY_TRACEBACK", "1")
    with pytest.raises(ValueError, match="boom"):
        cli.main(["run"])


def test_a_fault_in_one_job_of_a_sweep_leaves_the_others_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import te_assembly.cli.commands.run as run_command

    ran: list[str] = []

    def main(analysis: Analysis, console: Console) -> int:
        name = analysis.checked_plan().name
        ran.append(name)
        if name == "residual_mlp":
            raise ValueError("boom")
        return 0

    monkeypatch.setattr(run_command, "main", main)
    monkeypatch.delenv("TE_ASSEMBLY_TRACEBACK", raising=False)
    monkeypatch.chdir(tmp_path)  # Hydra records the sweep under multirun/
    assert cli.main(["run", "-m", "model=residual_mlp,two_stage"]) == 1
    assert ran == ["residual_mlp", "two_stage"]
    captured = capsys.readouterr()
    [line] = captured.err.strip().splitlines()  # Hydra's own "Error executing job" report stays out
    assert line.startswith("error: unexpected ValueError: boom")
    # The sweep's table reports both jobs: the fault as exit 1, the other job as it ended.
    assert re.search(r"model=residual_mlp\s*\S\s*1\b", captured.out), captured.out
    assert re.search(r"model=two_stage\s*\S\s*0\b", captured.out), captured.out
