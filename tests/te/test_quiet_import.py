"""On a machine without a GPU, importing TE makes torch's cpp_extension warn "No CUDA runtime is found"
at every run; te_assembly already says which engine and kernels run, so the TE engine's run is quiet."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.te

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the warning is about machines without a GPU")
def test_the_te_engine_on_cpu_prints_no_cuda_runtime_warning(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "te_assembly", "engine=te", "kernels=reference", "run.steps=1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "engine te" in done.stdout  # it did run TE's fuser
    assert "No CUDA runtime is found" not in done.stdout + done.stderr
