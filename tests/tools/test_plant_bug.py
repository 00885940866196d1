"""``scripts/plant_bug.py`` as docs/contributing.md shows it, run as written in a copy of the repository
(the planted file is never one another test is reading): the documented bug is caught, a harmless edit
survives, and the file is back as it was either way."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.docs_text import block_after

pytestmark = pytest.mark.tools

PLANTED = "te_assembly/data/conversations.py"


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    for part in ("te_assembly", "tests", "configs", "scripts", "recipes"):
        shutil.copytree(REPO_ROOT / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def _run(command: list[str], root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=600)


def test_the_documented_bug_is_caught_and_the_file_put_back(copy: Path) -> None:
    command = shlex.split(block_after("contributing.md", "**Planting a bug by hand**", "bash").strip())
    assert command[:2] == ["python", "scripts/plant_bug.py"] and command[2] == PLANTED
    before = (copy / PLANTED).read_bytes()
    done = _run([sys.executable, *command[1:]], copy)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "caught" in done.stdout and "1 failed" in done.stdout
    assert (copy / PLANTED).read_bytes() == before


def test_a_harmless_edit_survives_and_a_missing_text_is_refused(copy: Path) -> None:
    before = (copy / PLANTED).read_bytes()
    script = [sys.executable, "scripts/plant_bug.py", PLANTED]
    tests = ["--", "tests/language/test_instructions.py", "-k", "rows_train"]
    done = _run([*script, "padding (-1) after.", "padding (-1) after them.", *tests], copy)
    assert done.returncode == 1 and "SURVIVED" in done.stdout, done.stdout + done.stderr
    assert (copy / PLANTED).read_bytes() == before
    done = _run([*script, "text that is not there", "x", *tests], copy)
    assert done.returncode == 2 and "0 times" in done.stderr
    assert (copy / PLANTED).read_bytes() == before
