"""Faults no check foresaw still end in one line and exit 1, never a traceback (unless asked for)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from rich.console import Console

from te_assembly.cli import main as cli


def _failing(exc: Exception):  # type: ignore[no-untyped-def]
    def main(overrides: Sequence[str], console: Console) -> int:
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
