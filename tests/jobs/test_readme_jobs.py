"""The Python API guide's "Jobs from Python" snippet (docs/guides/python-api.md) runs as written from a
user's own directory, and each job returns what the commands print: the same loss as ``run``, a training
run that learns and writes its checkpoints, timings for every phase."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from te_assembly.jobs.bench.job import BenchResult
from te_assembly.jobs.run import RunResult
from te_assembly.jobs.train.result import TrainResult
from tests.docs_text import block_after

REPO_ROOT = Path(__file__).resolve().parents[2]


def _snippet() -> str:
    return block_after("guides/python-api.md", "**Jobs from Python.**")


def test_readme_jobs_snippet_runs_from_another_directory(
    monkeypatch: pytest.MonkeyPatch, capsys: Any, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    exec(compile(_snippet(), "python-api.md", "exec"), namespace)
    result, trained, timed = namespace["result"], namespace["trained"], namespace["timed"]
    assert isinstance(result, RunResult) and len(result.steps) == 2
    assert result.outputs[0].name == "y" and result.grad_norm > 0
    assert isinstance(trained, TrainResult) and len(trained.losses) == 20
    assert trained.losses[-1] < trained.losses[0]  # it learns the teacher
    names = sorted(p.name for p in (tmp_path / "runs" / "mlp").glob("ckpt-*.safetensors"))
    assert names == ["ckpt-0000010.safetensors", "ckpt-0000020.safetensors"]
    assert (tmp_path / "runs" / "mlp" / "metrics.jsonl").is_file()
    assert isinstance(timed, BenchResult)
    assert set(timed.summary) == {"forward ms", "backward ms", "step ms", "step tokens/s"}
    printed = capsys.readouterr().out
    assert f"loss {result.loss:.4g}" in printed and "ckpt-0000020.safetensors" in printed
