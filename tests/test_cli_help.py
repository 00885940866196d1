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


def test_import_hf_help_names_every_family_the_registry_holds() -> None:
    """The help is written from the family registry, so a family added there is named in it."""
    import os
    import subprocess
    import sys

    from te_assembly.formats.hf.families import FAMILIES

    done = subprocess.run(
        [sys.executable, "-m", "te_assembly", "import-hf", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "400"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for family in FAMILIES.values():
        assert family.model_type in done.stdout, family.model_type
