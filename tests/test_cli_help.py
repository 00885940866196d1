"""``--help`` anywhere on the command line prints the usage with every command, and exits 0."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from te_assembly.cli.main import COMMANDS


@pytest.mark.parametrize("args", [["--help"], ["validate", "--help"], ["help"], ["model=moe_block", "-h"]])
def test_help_lists_every_command(
    run_cli: Callable[..., subprocess.CompletedProcess[str]], args: list[str]
) -> None:
    done = run_cli(args)
    assert done.returncode == 0, done.stderr
    assert "usage: python -m te_assembly" in done.stdout
    for command in COMMANDS:
        assert f"  {command} " in done.stdout
