"""Timing library for ``bench``: interleaved repeats, FLOP counts, and the split / plain variants."""

from __future__ import annotations

from te_assembly.bench.flops import PEAK_SOURCE, forward_flops, peak_tflops
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
from te_assembly.bench.timing import Stats
from te_assembly.bench.variants import build_variants

__all__ = [
    "PEAK_SOURCE",
    "PHASES",
    "BenchSettings",
    "Bridge",
    "PlainModel",
    "SplitError",
    "SplitModel",
    "SplitPlan",
    "Stats",
    "Variant",
    "VariantResult",
    "bench_loss",
    "build_variants",
    "cut_at",
    "forward_flops",
    "make_optimizer",
    "peak_tflops",
    "plain_source",
    "plan_to_model",
    "run_benchmark",
    "split_plan",
]
