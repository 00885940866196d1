"""``bench``'s job: forward, backward and full-step (forward + backward + optimizer) times, tokens/s,
peak memory and achieved TFLOP/s, against the GPU's dense peak on a GPU the table knows
(``bench/peaks.py``, Ampere to Blackwell).

Forward and step are timed with ``torch.utils.benchmark.Timer``; backward by hand, since it frees its
graph (``bench/timing.py`` says how). FLOPs are counted by ``torch.utils.flop_counter.FlopCounterMode``,
or from the catalog for TE's own GEMM kernels, which the counter cannot see (``bench/flops.py``). A
phase whose spread is wide (IQR over 10% of the median), or a full step that comes out faster than its
forward or backward alone, is reported as noise.

``compare=true`` also times, interleaved in the same process, (b) the block cut in two fusers with the
crossing channels returned and passed back by the caller (TE's way before channels) and (c) the same
math as plain PyTorch, for ratios to (a). The full step uses ``train``'s optimizer
(``jobs/optimizer.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from te_assembly.analysis.fusions import FusionTarget
from te_assembly.analysis.plan import Plan
from te_assembly.diagnostics import did_you_mean, error
from te_assembly.engines.parallel.collectives import TIMER
from te_assembly.engines.parallel.context import ParallelContext
from te_assembly.engines.target import Target, as_target
from te_assembly.errors import ConfigError
from te_assembly.jobs.bench.flops import FlopCount, count_flops
from te_assembly.jobs.bench.fused import fired_fusions
from te_assembly.jobs.bench.peaks import Peak, gemm_precision, peak_for
from te_assembly.jobs.bench.runner import PHASES, Variant, VariantResult, bench_loss, run_benchmark
from te_assembly.jobs.bench.settings import BenchSettings
from te_assembly.jobs.bench.split import SplitPlan, split_points
from te_assembly.jobs.bench.timing import NOISE_THRESHOLD, Stats
from te_assembly.jobs.bench.variants import build_variants
from te_assembly.jobs.events import Advanced, Note, OnEvent, ignore

TASK = "timing"


@dataclass(frozen=True)
class Measuring:
    """The event before the timings start: what is timed (``tokens``: this rank's rows per call)."""

    tokens: int
    device_name: str
    split: SplitPlan | None


@dataclass
class BenchResult:
    """What ``bench`` measured: the variants' phase statistics ((a) first), the FLOPs and the peak they
    are measured against, every rank's steps under a parallel target, and the whole as JSON data
    (``report``, what ``bench.json`` holds)."""

    model: str
    device_name: str
    tokens: int
    """The rows this process read per call (``[batch, seq, features]``: batch * seq)."""
    results: list[VariantResult]
    flops: FlopCount
    peak: Peak
    split: SplitPlan | None
    warnings: list[str]
    ranks: list[dict[str, Any]] | None
    """Every rank's step (``bench/throughput.py``), under a parallel target."""
    report: dict[str, Any] = field(default_factory=dict)
    fusions: list[dict[str, Any]] = field(default_factory=list)
    """What TE's fusers of (a) fused, per fuser, beside the prediction (``bench/fused.py``); empty
    for the reference engine."""

    @property
    def summary(self) -> dict[str, float | str]:
        """This job's numbers for the table that ends a sweep (``bench -m ...``): (a)'s median per
        phase."""
        first = self.results[0]
        out: dict[str, float | str] = {f"{phase} ms": first.stats[phase].median * 1e3 for phase in PHASES}
        out["step tokens/s"] = self.tokens / first.stats["step"].median
        return out


def check_split_at(plan: Plan, split_at: str | None) -> None:
    """``bench.split_at`` names a step of this model that can start part 2: a config error otherwise."""
    points = split_points(plan)
    if split_at is None or split_at in points:
        return
    first = bool(plan.steps) and split_at == plan.steps[0].name
    why = "is the first step: part 1 would be empty" if first else f"is not a step of {plan.name}"
    message = f"{split_at!r} {why}; choose one of {', '.join(points) or 'none'}"
    hint = None if first else did_you_mean(split_at, points)
    raise ConfigError([error("bench.split_at", "bad-split-point", message, hint)])


def check_settings(plan: Plan, settings: BenchSettings, world_size: int) -> None:
    """Config errors of ``bench``'s settings against this model and world size."""
    check_split_at(plan, settings.split_at)
    if world_size > 1 and settings.compare:
        raise ConfigError(
            [
                error(
                    "bench.compare",
                    "conflicting-settings",
                    "bench.compare times variants in one process, but the parallel sizes ask for "
                    f"{world_size} processes",
                    "drop it under torchrun",
                )
            ]
        )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def noise_warnings(results: Sequence[VariantResult], threads: int | None = None) -> list[str]:
    """What the timings' own spread says about them: a phase whose IQR is wide, a full step faster
    than a part of it; and what to try (``threads``: ``bench.threads``, not suggested again when 1)."""
    out = []
    for r in results:
        for phase, s in r.stats.items():
            if s.noisy:
                out.append(
                    f"{r.name}, {phase}: the IQR is {100 * s.relative_spread:.0f}% of the median (over "
                    f"{100 * NOISE_THRESHOLD:.0f}%): these times are noise"
                )
        step = r.stats.get("step")
        for part in ("forward", "backward"):
            alone = r.stats.get(part)
            if step is not None and alone is not None and step.median < alone.median:
                out.append(
                    f"{r.name}: the full step ({_ms(step.median)} ms) came out faster than the {part} alone "
                    f"({_ms(alone.median)} ms), which is part of it: these times are noise"
                )
    if out:
        fewer = "" if threads == 1 else "bench.threads=1, "
        out.append(
            f"(the machine is busy or the work too small: rerun with {fewer}more bench.repeats, "
            "or a larger bench.tokens on a quieter machine)"
        )
    return out


def bench(
    plan: Plan, target: Target | str, settings: BenchSettings | None = None, *, on_event: OnEvent = ignore
) -> BenchResult:
    """Time ``plan`` on ``target`` (a ``Target``, or an engine name) as ``settings`` say (default
    ``BenchSettings()``). Raises ``ConfigError`` for settings that do not fit the model
    (``check_settings``) and, before anything is allocated, ``ResourceError`` when the variants and a
    batch cannot fit."""
    target = as_target(target)
    settings = settings if settings is not None else BenchSettings()
    par = target.context(plan)
    check_settings(plan, settings, par.settings.world_size)
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    count = 3 if settings.compare else 1
    target.check_fits(
        plan,
        f"benchmarking {plan.name}",
        "lower bench.tokens or make the model smaller",
        tokens=settings.tokens,
        models=count,
        trained=count,
        optimizer=settings.optimizer,
        seq_len=settings.seq_len,
    )
    torch.manual_seed(target.seed)
    variants, split = build_variants(
        plan,
        target,
        optimizer=settings.optimizer,
        lr=settings.lr,
        compare=settings.compare,
        split_at=settings.split_at,
    )
    x, inputs = _batch(plan, target, settings, on_event)
    # this rank's rows ([batch, seq, features]: batch * seq; token ids have no feature dimension)
    tokens = x.numel() if plan.takes_token_ids else x.numel() // x.shape[-1]
    device_name = torch.cuda.get_device_name(target.device) if target.device.type == "cuda" else "CPU"
    flops = _count_flops(variants[0], x, inputs, plan, tokens, target.te_kernels, settings.seq_len)
    on_event(Measuring(tokens, device_name, split))
    results = _timed(variants, x, inputs, target, settings, par.is_parallel, on_event)
    recipe_kind = target.recipe.kind if target.te_kernels else None
    precision = gemm_precision(target.dtype, te_gemms=target.te_gemms, recipe_kind=recipe_kind)
    rows = None
    if par.is_parallel:
        from te_assembly.jobs.bench.throughput import gather_rank_results

        rows = gather_rank_results(par, results[0], tokens)
    warnings = noise_warnings(results, settings.threads)
    if settings.repeats < 2:
        warnings.append("1 sample per phase: no spread to judge the times by (bench.repeats >= 5 is better)")
    peak = peak_for(target.device, precision)
    result = BenchResult(plan.name, device_name, tokens, results, flops, peak, split, warnings, rows)
    result.fusions = fired_fusions(plan, variants[0].model, _fusion_target(target))
    result.report = report_data(result, target, par)
    return result


def _batch(
    plan: Plan, target: Target, settings: BenchSettings, on_event: OnEvent
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The one batch every phase is timed on, drawn from the target's seed."""
    generator = torch.Generator().manual_seed(target.seed)
    x, inputs = target.sample(plan, settings.tokens, generator, settings.seq_len)
    if plan.num_params == 0:
        # Without parameters only the input's gradient gives backward something to compute.
        x.requires_grad_(True)
        on_event(
            Note(
                f"{plan.name} has no parameters: backward computes the gradient of x, and the step phase "
                "has no optimizer update"
            )
        )
    return x, inputs


def _timed(
    variants: list[Variant],
    x: torch.Tensor,
    inputs: dict[str, torch.Tensor],
    target: Target,
    settings: BenchSettings,
    parallel: bool,
    on_event: OnEvent,
) -> list[VariantResult]:
    """Every phase of every variant, interleaved; under torchrun, the time inside collectives too."""
    total = len(PHASES) * settings.repeats * len(variants)
    done = 0

    def sampled() -> None:
        nonlocal done
        done += 1
        on_event(Advanced(TASK, done, total))

    TIMER.enabled = parallel
    try:
        return run_benchmark(
            variants,
            x,
            inputs,
            device=target.device,
            warmup=settings.warmup,
            repeats=settings.repeats,
            on_sample=sampled,
            comm_clock=(lambda: TIMER.seconds) if parallel else None,
        )
    finally:
        TIMER.enabled = False


def _fusion_target(target: Target) -> FusionTarget:
    capability = torch.cuda.get_device_capability(target.device) if target.device.type == "cuda" else None
    recipe = target.recipe if target.engine == "te" else None
    fusion = FusionTarget.of(None, recipe=recipe, dtype=target.dtype_name, kernels=target.kernels)
    return dataclasses.replace(fusion, name=str(target.device), capability=capability)


def _count_flops(
    variant: Variant,
    x: torch.Tensor,
    inputs: dict[str, torch.Tensor],
    plan: Plan,
    tokens: int,
    te_kernels: bool,
    seq_len: int | None,
) -> FlopCount:
    """One counted forward and backward of (a), before any timing; its gradients are cleared."""

    def forward() -> torch.Tensor:
        return bench_loss(variant.model(x, **inputs), variant.loss_outputs, x)

    count = count_flops(forward, plan, tokens, te_kernels=te_kernels, seq_len=seq_len)
    variant.optimizer.zero_grad(set_to_none=True)
    if x.grad is not None:
        x.grad = None
    return count


def _stats_json(s: Stats, tokens: int, flops: int, peak: Peak, method: str | None) -> dict[str, Any]:
    achieved = flops / s.median / 1e12
    return {
        "median_s": s.median,
        "q1_s": s.q1,
        "q3_s": s.q3,
        "min_s": s.min,
        "max_s": s.max,
        "n": s.n,
        "iqr_over_median": s.relative_spread,
        "noisy": s.noisy,
        "tokens_per_s": tokens / s.median,
        "flops": flops,
        "tflops": achieved,
        "pct_of_peak": 100 * achieved / peak.tflops if peak.tflops else None,
        "method": method,
    }


def report_data(result: BenchResult, target: Target, par: ParallelContext) -> dict[str, Any]:
    """The numbers as JSON data, for scripts (``bench/parallel_scaling.py``) and for keeping."""
    from te_assembly.jobs.bench.throughput import aggregate

    settings = par.settings
    first, tokens, flops, peak = result.results[0], result.tokens, result.flops, result.peak
    report: dict[str, Any] = {
        "model": result.model,
        "device": result.device_name,
        "engine": target.engine,
        "kernels": target.kernels,
        "dtype": target.dtype_name,
        "tokens": tokens,
        "flops": {
            "forward": flops.forward,
            "backward": flops.backward,
            "source": flops.source,
            "note": flops.note,
        },
        "peak": {
            "gpu": peak.gpu.name if peak.gpu is not None else None,
            "device": peak.device,
            "precision": peak.precision,
            "tflops": peak.tflops,
            "source": peak.gpu.source if peak.gpu is not None else None,
            "why_none": peak.why_none or None,
        },
        "variants": [
            {
                "name": r.name,
                "phases": {
                    p: _stats_json(st, tokens, flops.of(p), peak, r.methods.get(p))
                    for p, st in r.stats.items()
                },
                "peak_bytes": r.peak_bytes,
            }
            for r in result.results
        ],
        "warnings": list(result.warnings),
        "parallel": settings.sizes(),
        "world_size": settings.world_size,
        "rank0": {"tokens": tokens, "phases": {p: s.median for p, s in first.stats.items()}},
    }
    if result.ranks is not None:
        report["ranks"] = result.ranks
        report["job"] = aggregate(result.ranks, tokens * settings.row_shards)
    else:
        step = first.stats["step"].median
        report["job"] = {"step_s": step, "tokens_per_s": tokens / step, "comm_share": 0.0}
    report["fusions"] = result.fusions
    return report


__all__ = [
    "BenchResult",
    "Measuring",
    "bench",
    "check_settings",
    "check_split_at",
    "noise_warnings",
    "report_data",
]
