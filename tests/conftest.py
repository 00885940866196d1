"""Fixtures shared across test folders. Keep this small: folder-specific helpers live in their folder."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def _run_cli(args: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    # A wide terminal keeps rich from wrapping messages, so tests can search for whole phrases.
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run(
        [sys.executable, "-m", "te_assembly", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def run_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``python -m te_assembly ARGS...`` in a subprocess; returns the completed process."""
    return _run_cli
