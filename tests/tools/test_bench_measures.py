"""What ``bench`` measures with: ``torch.utils.benchmark`` timers, ``FlopCounterMode`` counts, noise
warnings from its own spread, and the GPU peak table (Ampere to Blackwell, "unknown GPU" otherwise)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from te_assembly.engines import build
from te_assembly.jobs.bench import peaks
from te_assembly.jobs.bench.flops import CATALOG, COUNTER, count_flops, forward_flops
from te_assembly.jobs.bench.job import noise_warnings
from te_assembly.jobs.bench.runner import VariantResult, bench_loss
from te_assembly.jobs.bench.timing import NOISE_THRESHOLD, PhaseTimer, Stats
from tests.engines._helpers import plan_from_yaml

RunCli = Callable[..., subprocess.CompletedProcess[str]]

DENSE = """
name: dense
in_features: 6
ops:
  - {name: fc1, op: Linear, args: {in_features: 6, out_features: 10}}
  - {name: act, op: GELU}
  - {name: fc2, op: Linear, args: {in_features: 10, out_features: 6, bias: false}}
"""


def _stats(median: float, spread: float) -> Stats:
    return Stats(median, median - spread / 2, median + spread / 2, median - spread, median + spread, 10)


def _result(forward: Stats, backward: Stats, step: Stats) -> VariantResult:
    return VariantResult("(a)", {"forward": forward, "backward": backward, "step": step})


def test_quiet_consistent_times_give_no_warning() -> None:
    result = _result(_stats(1.0, 0.01), _stats(2.0, 0.02), _stats(3.2, 0.03))
    assert noise_warnings([result]) == []


def test_a_wide_spread_is_called_noise() -> None:
    wide = _stats(1.0, 2 * NOISE_THRESHOLD)  # IQR 2x the threshold share of the median
    assert wide.noisy and not _stats(1.0, NOISE_THRESHOLD / 2).noisy
    warnings = noise_warnings([_result(wide, _stats(2.0, 0.02), _stats(3.2, 0.03))])
    assert any("(a), forward" in w and "noise" in w for w in warnings), warnings
    assert not any("backward" in w and "IQR" in w for w in warnings)
    assert "bench.threads=1" in warnings[-1]
    # Already on one thread: the advice does not suggest it again.
    once = noise_warnings([_result(wide, _stats(2.0, 0.02), _stats(3.2, 0.03))], threads=1)
    assert "bench.threads=1" not in once[-1] and "more bench.repeats" in once[-1]


@pytest.mark.parametrize("part", ["forward", "backward"])
def test_a_step_faster_than_its_part_is_called_noise(part: str) -> None:
    times = {"forward": _stats(1.0, 0.01), "backward": _stats(2.0, 0.02)}
    times[part] = _stats(5.0, 0.05)
    warnings = noise_warnings([_result(times["forward"], times["backward"], _stats(3.2, 0.03))])
    assert any(f"faster than the {part} alone" in w for w in warnings), warnings


def test_one_sample_has_no_spread() -> None:
    assert not Stats.of([0.5]).noisy
    assert Stats.of([1.0, 2.0, 3.0, 4.0, 5.0]).median == 3.0


def test_phase_timer_uses_torch_utils_benchmark() -> None:
    calls: list[int] = []
    timer = PhaseTimer(lambda: calls.append(1), device=torch.device("cpu"), label="t", phase="forward")
    for _ in range(3):
        assert timer.sample() >= 0
    from torch.utils.benchmark import Measurement

    assert len(timer.measurements) == 3 and all(isinstance(m, Measurement) for m in timer.measurements)
    assert len(calls) == 3 * 3  # timeit(number=1): two untimed runs and the timed one per sample
    assert timer.stats().n == 3
    assert "torch.utils.benchmark.Timer" in timer.method
    by_hand = PhaseTimer(lambda prepared: None, lambda: None, device=torch.device("cpu"))
    by_hand.sample()
    assert "by hand" in by_hand.method and by_hand.measurements == []


def test_flop_counter_counts_what_the_catalog_predicts_for_dense_gemms() -> None:
    plan = plan_from_yaml(DENSE)
    torch.manual_seed(0)
    model = build(plan, "reference")
    tokens = 7
    x = torch.randn(tokens, 6)

    def forward() -> torch.Tensor:
        return bench_loss(model(x), [])

    count = count_flops(forward, plan, tokens, te_kernels=False)
    assert count.source == COUNTER
    expected = 2 * tokens * (6 * 10 + 10 * 6)
    assert count.forward == forward_flops(plan, tokens) == expected
    # Backward: weight gradients of both linears and the data gradient of fc2's input, not of x
    # (which needs none): FlopCounterMode counts what runs.
    assert count.backward == 2 * tokens * (6 * 10 + 10 * 6) + 2 * tokens * 10 * 6
    assert count.step == count.forward + count.backward
    with_te = count_flops(forward, plan, tokens, te_kernels=True)
    assert with_te.source == CATALOG and with_te.backward == 2 * with_te.forward and with_te.note


@pytest.mark.parametrize(
    ("device_name", "table_name"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA GB200", "GB200"),
    ],
)
def test_the_peak_table_covers_ampere_to_blackwell(device_name: str, table_name: str) -> None:
    gpu = peaks.find_gpu(device_name)
    assert gpu is not None and gpu.name == table_name
    # Dense tensor-core rates are ordered: TF32 < BF16 (< FP8 where the GPU has it).
    assert gpu.tflops["tf32"] < gpu.tflops["bf16"]
    if "fp8" in gpu.tflops:
        assert gpu.tflops["bf16"] < gpu.tflops["fp8"]


def test_datasheet_figures_for_two_gpus() -> None:
    """H100 SXM: BF16 1,979 and TF32 989 TFLOP/s with sparsity, so 989.5 / 494.5 dense; A100: BF16 312."""
    h100, a100 = peaks.find_gpu("NVIDIA H100 80GB HBM3"), peaks.find_gpu("NVIDIA A100-PCIE-40GB")
    assert h100 is not None and a100 is not None
    assert (h100.tflops["bf16"], h100.tflops["tf32"], h100.tflops["fp8"]) == (989.5, 494.5, 1979.0)
    assert a100.tflops["bf16"] == 312.0 and "fp8" not in a100.tflops


def test_unknown_gpu_and_cpu_have_no_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA Tesla K80")
    peak = peaks.peak_for(torch.device("cuda", 0), "bf16")
    assert peak.tflops is None and "unknown GPU" in peak.describe() and "K80" in peak.describe()
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    known = peaks.peak_for(torch.device("cuda", 0), "bf16")
    assert known.tflops == 989.5 and "H100 SXM" in known.describe()
    assert peaks.peak_for(torch.device("cuda", 0), "fp4").tflops is None  # Hopper has no FP4 path
    assert peaks.peak_for(torch.device("cpu"), "fp32").tflops is None


def test_gemm_precision_follows_the_recipe_and_dtype() -> None:
    assert peaks.gemm_precision(torch.bfloat16, te_gemms=True) == "bf16"
    assert peaks.gemm_precision(torch.float32, te_gemms=True) == "tf32"
    assert peaks.gemm_precision(torch.bfloat16, te_gemms=True, recipe_kind="MXFP8BlockScaling") == "fp8"
    assert peaks.gemm_precision(torch.bfloat16, te_gemms=True, recipe_kind="NVFP4BlockScaling") == "fp4"
    assert peaks.gemm_precision(torch.bfloat16, te_gemms=False, recipe_kind="MXFP8BlockScaling") == "bf16"


def test_cli_bench_reports_its_methods_flops_and_warns_without_spread(
    run_cli: RunCli, tmp_path: Path
) -> None:
    report = tmp_path / "bench.json"
    done = run_cli(
        [
            "bench",
            "model=residual_mlp",
            "bench.tokens=16",
            "bench.warmup=0",
            "bench.repeats=1",
            f"bench.report={report}",
            f"hydra.run.dir={tmp_path / 'run'}",
        ]
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "forward: torch.utils.benchmark.Timer" in out
    assert "backward: timed by hand" in out and "timed with timed" not in out
    assert "from torch.utils.flop_counter.FlopCounterMode" in out
    assert "warning: 1 sample per phase" in out
    assert "% of peak: n/a (no peak table for CPUs)" in out
    data = json.loads(report.read_text())
    assert data["flops"]["source"] == COUNTER
    assert data["flops"]["forward"] == 2 * 16 * (64 * 256 + 128 * 64)  # residual_mlp's two linears
    assert any("1 sample per phase" in w for w in data["warnings"])
    assert (tmp_path / "run" / "config.yaml").exists()
