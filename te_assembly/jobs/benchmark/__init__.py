"""Timing library for ``bench``: interleaved repeats, FLOP counts, and the split / plain variants.

Names are imported on first use, so ``te_assembly.jobs.benchmark.settings`` imports without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from te_assembly.lazy import lazy_attributes

if TYPE_CHECKING:
    from te_assembly.jobs.benchmark.flops import FlopCount, count_flops, forward_flops
    from te_assembly.jobs.benchmark.peaks import Peak, gemm_precision, peak_for, peak_tflops
    from te_assembly.jobs.benchmark.plain import PlainModel, plain_source
    from te_assembly.jobs.benchmark.runner import (
        PHASES,
        Variant,
        VariantResult,
        bench_loss,
        run_benchmark,
    )
    from te_assembly.jobs.benchmark.settings import BenchSettings
    from te_assembly.jobs.benchmark.split import (
        Bridge,
        SplitError,
        SplitModel,
        SplitPlan,
        compare_cuts,
        cut_at,
        plan_to_model,
        split_plan,
    )
    from te_assembly.jobs.benchmark.timing import NOISE_THRESHOLD, Stats
    from te_assembly.jobs.benchmark.variants import build_variants

_LAZY = {
    "FlopCount": "te_assembly.jobs.benchmark.flops",
    "count_flops": "te_assembly.jobs.benchmark.flops",
    "forward_flops": "te_assembly.jobs.benchmark.flops",
    "Peak": "te_assembly.jobs.benchmark.peaks",
    "gemm_precision": "te_assembly.jobs.benchmark.peaks",
    "peak_for": "te_assembly.jobs.benchmark.peaks",
    "peak_tflops": "te_assembly.jobs.benchmark.peaks",
    "PlainModel": "te_assembly.jobs.benchmark.plain",
    "plain_source": "te_assembly.jobs.benchmark.plain",
    "PHASES": "te_assembly.jobs.benchmark.runner",
    "Variant": "te_assembly.jobs.benchmark.runner",
    "VariantResult": "te_assembly.jobs.benchmark.runner",
    "bench_loss": "te_assembly.jobs.benchmark.runner",
    "run_benchmark": "te_assembly.jobs.benchmark.runner",
    "BenchSettings": "te_assembly.jobs.benchmark.settings",
    "Bridge": "te_assembly.jobs.benchmark.split",
    "SplitError": "te_assembly.jobs.benchmark.split",
    "SplitModel": "te_assembly.jobs.benchmark.split",
    "SplitPlan": "te_assembly.jobs.benchmark.split",
    "compare_cuts": "te_assembly.jobs.benchmark.split",
    "cut_at": "te_assembly.jobs.benchmark.split",
    "plan_to_model": "te_assembly.jobs.benchmark.split",
    "split_plan": "te_assembly.jobs.benchmark.split",
    "NOISE_THRESHOLD": "te_assembly.jobs.benchmark.timing",
    "Stats": "te_assembly.jobs.benchmark.timing",
    "build_variants": "te_assembly.jobs.benchmark.variants",
}


__getattr__ = lazy_attributes(__name__, _LAZY)


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
    "compare_cuts",
    "count_flops",
    "cut_at",
    "forward_flops",
    "gemm_precision",
    "peak_for",
    "peak_tflops",
    "plain_source",
    "plan_to_model",
    "run_benchmark",
    "split_plan",
]
