"""Timing library for ``bench``: interleaved repeats, FLOP counts, and the split / plain variants.

Names are imported on first use, so ``te_assembly.bench.settings`` imports without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from te_assembly.lazy import lazy_attributes

if TYPE_CHECKING:
    from te_assembly.bench.flops import FlopCount, count_flops, forward_flops
    from te_assembly.bench.peaks import Peak, gemm_precision, peak_for, peak_tflops
    from te_assembly.bench.plain import PlainModel, plain_source
    from te_assembly.bench.runner import (
        PHASES,
        Variant,
        VariantResult,
        bench_loss,
        make_optimizer,
        run_benchmark,
    )
    from te_assembly.bench.settings import BenchSettings
    from te_assembly.bench.split import (
        Bridge,
        SplitError,
        SplitModel,
        SplitPlan,
        compare_cuts,
        cut_at,
        plan_to_model,
        split_plan,
    )
    from te_assembly.bench.timing import NOISE_THRESHOLD, Stats
    from te_assembly.bench.variants import build_variants

_LAZY = {
    "FlopCount": "te_assembly.bench.flops",
    "count_flops": "te_assembly.bench.flops",
    "forward_flops": "te_assembly.bench.flops",
    "Peak": "te_assembly.bench.peaks",
    "gemm_precision": "te_assembly.bench.peaks",
    "peak_for": "te_assembly.bench.peaks",
    "peak_tflops": "te_assembly.bench.peaks",
    "PlainModel": "te_assembly.bench.plain",
    "plain_source": "te_assembly.bench.plain",
    "PHASES": "te_assembly.bench.runner",
    "Variant": "te_assembly.bench.runner",
    "VariantResult": "te_assembly.bench.runner",
    "bench_loss": "te_assembly.bench.runner",
    "make_optimizer": "te_assembly.bench.runner",
    "run_benchmark": "te_assembly.bench.runner",
    "BenchSettings": "te_assembly.bench.settings",
    "Bridge": "te_assembly.bench.split",
    "SplitError": "te_assembly.bench.split",
    "SplitModel": "te_assembly.bench.split",
    "SplitPlan": "te_assembly.bench.split",
    "compare_cuts": "te_assembly.bench.split",
    "cut_at": "te_assembly.bench.split",
    "plan_to_model": "te_assembly.bench.split",
    "split_plan": "te_assembly.bench.split",
    "NOISE_THRESHOLD": "te_assembly.bench.timing",
    "Stats": "te_assembly.bench.timing",
    "build_variants": "te_assembly.bench.variants",
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
    "make_optimizer",
    "peak_for",
    "peak_tflops",
    "plain_source",
    "plan_to_model",
    "run_benchmark",
    "split_plan",
]
