"""The ``bench`` job (``job.py``) and its timing library: interleaved repeats (``runner.py``,
``timing.py``), FLOP counts and GPU peaks (``flops.py``, ``peaks.py``), the fusions TE fired
(``fused.py``), the split and plain variants (``split.py``, ``plain.py``, ``variants.py``), every rank's
numbers under torchrun (``throughput.py``) and the ``bench:`` settings (``settings.py``, pure Python).

Names are imported on first use, so ``te_assembly.jobs.bench.settings`` imports without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from te_assembly.lazy import lazy_attributes

if TYPE_CHECKING:
    from te_assembly.jobs.bench.flops import FlopCount, count_flops, forward_flops
    from te_assembly.jobs.bench.job import BenchResult, Measuring, bench, check_settings
    from te_assembly.jobs.bench.peaks import Peak, gemm_precision, peak_for, peak_tflops
    from te_assembly.jobs.bench.plain import PlainModel, plain_source
    from te_assembly.jobs.bench.runner import (
        PHASES,
        Variant,
        VariantResult,
        bench_loss,
        run_benchmark,
    )
    from te_assembly.jobs.bench.settings import BenchSettings
    from te_assembly.jobs.bench.split import (
        Bridge,
        SplitError,
        SplitModel,
        SplitPlan,
        compare_cuts,
        cut_at,
        plan_to_model,
        split_plan,
    )
    from te_assembly.jobs.bench.timing import NOISE_THRESHOLD, Stats
    from te_assembly.jobs.bench.variants import build_variants

_LAZY = {
    "bench": "te_assembly.jobs.bench.job",
    "BenchResult": "te_assembly.jobs.bench.job",
    "Measuring": "te_assembly.jobs.bench.job",
    "check_settings": "te_assembly.jobs.bench.job",
    "FlopCount": "te_assembly.jobs.bench.flops",
    "count_flops": "te_assembly.jobs.bench.flops",
    "forward_flops": "te_assembly.jobs.bench.flops",
    "Peak": "te_assembly.jobs.bench.peaks",
    "gemm_precision": "te_assembly.jobs.bench.peaks",
    "peak_for": "te_assembly.jobs.bench.peaks",
    "peak_tflops": "te_assembly.jobs.bench.peaks",
    "PlainModel": "te_assembly.jobs.bench.plain",
    "plain_source": "te_assembly.jobs.bench.plain",
    "PHASES": "te_assembly.jobs.bench.runner",
    "Variant": "te_assembly.jobs.bench.runner",
    "VariantResult": "te_assembly.jobs.bench.runner",
    "bench_loss": "te_assembly.jobs.bench.runner",
    "run_benchmark": "te_assembly.jobs.bench.runner",
    "BenchSettings": "te_assembly.jobs.bench.settings",
    "Bridge": "te_assembly.jobs.bench.split",
    "SplitError": "te_assembly.jobs.bench.split",
    "SplitModel": "te_assembly.jobs.bench.split",
    "SplitPlan": "te_assembly.jobs.bench.split",
    "compare_cuts": "te_assembly.jobs.bench.split",
    "cut_at": "te_assembly.jobs.bench.split",
    "plan_to_model": "te_assembly.jobs.bench.split",
    "split_plan": "te_assembly.jobs.bench.split",
    "NOISE_THRESHOLD": "te_assembly.jobs.bench.timing",
    "Stats": "te_assembly.jobs.bench.timing",
    "build_variants": "te_assembly.jobs.bench.variants",
}


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = [
    "NOISE_THRESHOLD",
    "PHASES",
    "BenchResult",
    "BenchSettings",
    "Bridge",
    "FlopCount",
    "Measuring",
    "Peak",
    "PlainModel",
    "SplitError",
    "SplitModel",
    "SplitPlan",
    "Stats",
    "Variant",
    "VariantResult",
    "bench",
    "bench_loss",
    "build_variants",
    "check_settings",
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
