"""scripts/gpu_report.py's measuring code, run on CPU (TE's fuser with kernels=reference) so that its
bookkeeping is proven before the GPU run it is written for: verify cells, bench numbers, recipe effect,
and the summary that joins the steps."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "scripts"))

import gpu_report  # noqa: E402


@pytest.fixture
def on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_report, "DEVICE", "cpu")
    monkeypatch.setattr(gpu_report, "KERNELS", "reference")
    monkeypatch.setattr(gpu_report, "_unsupported", lambda recipe: None)


@pytest.mark.te
@pytest.mark.usefixtures("on_cpu")
def test_verify_cell_reports_pass_with_its_precision() -> None:
    row = gpu_report.verify_cell(gpu_report.Cell("residual_mlp", "bf16", "float32"))
    assert row["status"] == "pass" and row["precision"] == "float32" and row["tensors"] == 8
    assert row["failures"] == [] and 0 <= row["worst_max_rel"] < 1e-5
    moe = gpu_report.verify_cell(gpu_report.Cell("moe_block", "bf16"))
    assert moe["status"] == "pass" and moe["precision"] == "bfloat16", moe


@pytest.mark.te
@pytest.mark.usefixtures("on_cpu")
def test_bench_cell_reports_tokens_per_second() -> None:
    row = gpu_report.bench_cell(gpu_report.BenchCell(gpu_report.Cell("moe_block", "bf16"), 64))
    assert row["status"] == "ok" and row["tokens"] == 64 and row["peak_tflops"] is None  # CPU: no peak
    (variant,) = row["variants"]
    step = variant["phases"]["step"]
    assert step["tokens_per_s"] == pytest.approx(64 / (step["median_ms"] / 1e3))
    assert step["tflops"] == pytest.approx(3 * row["forward_gemm_flops"] / (step["median_ms"] / 1e3) / 1e12)


@pytest.mark.te
def test_recipe_effect_without_quantization_is_not_active() -> None:
    from te_assembly.engines.target import Target
    from te_assembly.jobs.verify import recipe_effect

    # channel_demo's TE kernels run on CPU; a recipe that quantizes nothing moves nothing.
    effect = recipe_effect("channel_demo", Target.of("te"), {"kind": "none", "name": "bf16"}, tokens=32)
    assert effect.shift == 0 and not effect.active and effect.scale > 0


def test_summary_joins_the_steps(tmp_path: Path) -> None:
    (tmp_path / "verify.json").write_text(json.dumps({"passed": True, "cells": []}))
    (tmp_path / "steps.tsv").write_text("facts\tpassed\t3\t\nbench\tskipped\t0\tout of time budget\n")
    (tmp_path / "pytest-gpu.xml").write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.a" name="ok"/>'
        '<testcase classname="tests.a" name="bad"><failure message="x"/></testcase>'
        '<testcase classname="tests.b" name="hw"><skipped message="this GPU cannot run it"/></testcase>'
        "</testsuite></testsuites>"
    )
    doc = gpu_report.summary(tmp_path, tmp_path / "summary.json")
    assert json.loads((tmp_path / "summary.json").read_text()) == json.loads(json.dumps(doc, default=str))
    assert doc["verify"] == {"passed": True, "cells": []}
    assert doc["steps"][1] == {
        "step": "bench",
        "status": "skipped",
        "seconds": 0.0,
        "note": "out of time budget",
    }
    assert (doc["pytest"]["passed"], doc["pytest"]["failed"], doc["pytest"]["skipped"]) == (1, 1, 1)
    assert doc["pytest"]["failed_tests"] == ["tests.a::bad"]


def test_every_grid_cell_names_a_shipped_model_and_recipe() -> None:
    from te_assembly.analysis.recipes import available_recipes
    from te_assembly.config import available_models

    cells = [*gpu_report.VERIFY_GRID, *(b.cell for b in gpu_report.BENCH_GRID)]
    assert {c.model for c in cells} <= set(available_models())
    assert {c.recipe for c in gpu_report.VERIFY_GRID} == set(available_recipes())
    assert torch.bfloat16 == gpu_report._dtype("bfloat16")


class _FakeTE:
    """Stand-ins for the TE modules scripts/gpu_sanity.py calls, computing what TE computes (float32
    inside, one rounding), so its checks run on CPU and must all pass."""

    class Linear(torch.nn.Linear):
        def __init__(
            self,
            i: int,
            o: int,
            bias: bool = True,
            params_dtype: torch.dtype | None = None,
            device: str | None = None,
        ) -> None:
            super().__init__(i, o, bias, device=device, dtype=params_dtype)

    class LayerNorm(torch.nn.LayerNorm):
        def __init__(self, n: int, eps: float, dtype: torch.dtype, device: str) -> None:
            super().__init__(n, eps, device=device, dtype=dtype)

    class RMSNorm(torch.nn.Module):
        def __init__(self, n: int, eps: float, dtype: torch.dtype, device: str) -> None:
            super().__init__()
            self.eps, self.weight = eps, torch.nn.Parameter(torch.ones(n, dtype=dtype, device=device))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x32 = x.float()
            return (
                x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + self.eps) * self.weight.float()
            ).to(x.dtype)

    @staticmethod
    def autocast(enabled: bool, recipe: object) -> object:
        import contextlib

        return contextlib.nullcontext()


def test_gpu_sanity_checks_run_and_pass_against_faithful_stand_ins(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpu_sanity

    monkeypatch.setattr(gpu_sanity, "DEVICE", "cpu")
    monkeypatch.setattr(gpu_sanity, "RESULTS", [])
    fake = _FakeTE()
    for check in (gpu_sanity.check_linear, gpu_sanity.check_norms, gpu_sanity.check_recipes):
        check(fake)
    names = [r.name for r in gpu_sanity.RESULTS]
    assert len(names) == 11 and all(r.passed for r in gpu_sanity.RESULTS), gpu_sanity.RESULTS
    assert {r.precision for r in gpu_sanity.RESULTS if "float32" in r.name and "Linear" in r.name} == {"tf32"}
