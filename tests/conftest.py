"""Fixtures shared across test folders. Keep this small: folder-specific helpers live in their folder.

Test tiers: a ``te`` test skips with the reason when Transformer Engine does not import, and fails
instead when ``TE_ASSEMBLY_REQUIRE_TE=1`` (CI's TE tier, after installing it); a ``gpu`` test also
needs a CUDA GPU, and fails instead of skipping without one when ``TE_ASSEMBLY_REQUIRE_GPU=1``
(``scripts/gpu_check.sh`` sets both: on the GPU machine a skip would hide a broken install)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import settings

REPO_ROOT = Path(__file__).resolve().parent.parent

pytest_plugins = ("pytester",)  # tests/testing: te_assembly's pytest plugin in a user's project

# CI replays the same examples every run (a red CI then means a code change, not a new random draw);
# local runs keep exploring and print a reproduction blob for anything they find.
settings.register_profile("ci", derandomize=True, print_blob=True, database=None)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


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


def user_cli(
    cwd: Path,
    *args: str,
    timeout: float = 300,
    pythonpath: str = "",
    umask: int | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m te_assembly ARGS...`` as a user runs it, in ``cwd`` (outside the repository), the
    package found through ``PYTHONPATH`` as an installed one (``pythonpath``: more folders after it).
    ``umask``: the child's own; ``env``: more environment variables."""
    path = os.pathsep.join(p for p in (str(REPO_ROOT), pythonpath) if p)
    environment = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb", "PYTHONPATH": path}
    return subprocess.run(
        [sys.executable, "-m", "te_assembly", *args],
        cwd=cwd,
        env={**environment, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=None if umask is None else lambda: os.umask(umask),
    )


@pytest.fixture
def run_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``python -m te_assembly ARGS...`` in a subprocess; returns the completed process."""
    return _run_cli


@functools.cache
def te_import_error() -> str | None:
    """Why ``transformer_engine.pytorch`` does not import here, or None when it does."""
    try:
        import torch  # noqa: F401  - TE's core library needs torch's libnccl loaded first
        import transformer_engine.pytorch  # noqa: F401
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _te_required() -> bool:
    return os.environ.get("TE_ASSEMBLY_REQUIRE_TE") == "1"


def _gpu_required() -> bool:
    return os.environ.get("TE_ASSEMBLY_REQUIRE_GPU") == "1"


@pytest.fixture(autouse=True)
def _te_tiers(request: pytest.FixtureRequest) -> None:
    marked_te = request.node.get_closest_marker("te") is not None
    marked_gpu = request.node.get_closest_marker("gpu") is not None
    if not (marked_te or marked_gpu):
        return
    problem = te_import_error()
    if problem is not None:
        reason = f"transformer_engine.pytorch does not import ({problem}); run scripts/install_te_cpu.sh"
        if _te_required():
            pytest.fail(f"TE_ASSEMBLY_REQUIRE_TE=1 but {reason}")
        if _gpu_required() and marked_gpu:
            pytest.fail(f"TE_ASSEMBLY_REQUIRE_GPU=1 but {reason}")
        pytest.skip(reason)
    if marked_gpu:
        import torch

        if not torch.cuda.is_available():
            reason = "no CUDA GPU visible: the gpu tier runs TE's kernels"
            if _gpu_required():
                pytest.fail(f"TE_ASSEMBLY_REQUIRE_GPU=1 but {reason}")
            pytest.skip(reason)
