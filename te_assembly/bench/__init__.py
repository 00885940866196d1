"""Timing library for ``bench``: interleaved repeats, FLOP counts, and the split / plain variants."""

from __future__ import annotations

from te_assembly.bench.flops import FlopCount, count_flops, forward_flops
from te_assembly.bench.peaks import Peak, gemm_precision, peak_for, peak_tflops
from te_assembly.bench.plain import PlainModel, plain_source
from te_assembly.bench.runner import PHASES, Variant, VariantResult, bench_loss, make_optimizer, run_benchmark
from te_assembly.bench.settings import BenchSettings
from te_assembly.bench.split import (
    Bridge,
    SplitError,
    SplitModel,
    SplitPlan,
    cut_at,
    plan_to_model,
    split_plan,
)
from te_assembly.bench.timing import NOISE_THRESHOLD, Stats
from te_assembly.bench.variants import build_variants

__all__ = [
    "NOISE_THRESHOLD",
    "PHASES",
    "BenchSettings",
    "Bridge",
    "FlopCount",
    "Peak",
    "PlainModel",
    "SplitError",
    "SplitModel",
    "SplitPlan",
    "Stats",
    "Variant",
    "VariantResult",
    "bench_loss",
    "build_variants",
    "count_flops",
    "cut_at",
    "forward_flops",
    "gemm_precision",
    "make_optimizer",
    "peak_for",
    "peak_tflops",
    "plain_source",
    "plan_to_model",
    "run_benchmark",
    "split_plan",
]
