"""``bench``: forward, backward and full-step (forward + backward + optimizer) times, tokens/s, peak
memory and achieved TFLOP/s, against the GPU's dense peak on a GPU the table knows
(``te_assembly/jobs/benchmark/peaks.py``, Ampere to Blackwell).

Forward and step are timed with ``torch.utils.benchmark.Timer``; backward by hand, since it frees its
graph (``te_assembly/jobs/benchmark/timing.py`` says how). FLOPs are counted by
``torch.utils.flop_counter.FlopCounterMode``, or from the catalog for TE's own GEMM kernels, which the
counter cannot see (``te_assembly/jobs/benchmark/flops.py``). A phase whose spread is wide (IQR over 10% of the
median), or a full step that comes out faster than its forward or backward alone, is reported as noise.

``bench.compare=true`` also times, interleaved in the same process, (b) the block cut in two fusers
with the crossing channels returned and passed back by the caller (TE's way before channels) and
(c) the same math as plain PyTorch, and prints ratios to (a).

Writes the numbers as ``bench.json`` and the resolved config as ``config.yaml`` into the run directory
(``outputs/<model>/<date>_<time>/``); ``bench.report=FILE`` writes the JSON there too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from te_assembly.analysis.analyze import COMMON_SECTIONS, Analysis
from te_assembly.analysis.plan import Plan
from te_assembly.cli import job_dir
from te_assembly.cli.commands import Outcome
from te_assembly.cli.commands.session import Session, start
from te_assembly.diagnostics import did_you_mean, error, printable
from te_assembly.engines.data import sample_public_inputs, sample_x
from te_assembly.engines.memory import check_fits, estimate, fused_attention
from te_assembly.engines.parallel.collectives import TIMER
from te_assembly.engines.parallel.context import ParallelContext
from te_assembly.errors import ConfigError
from te_assembly.jobs.benchmark import (
    NOISE_THRESHOLD,
    PHASES,
    BenchSettings,
    FlopCount,
    Peak,
    SplitPlan,
    Stats,
    VariantResult,
    bench_loss,
    build_variants,
    count_flops,
    gemm_precision,
    peak_for,
    run_benchmark,
)
from te_assembly.jobs.benchmark.runner import Variant, process_peak_rss_mib
from te_assembly.jobs.benchmark.split import split_points
from te_assembly.jobs.benchmark.throughput import gather_rank_results, rank_table
from te_assembly.outputs import write_text_atomic

SECTIONS = {**COMMON_SECTIONS, "bench": BenchSettings}
RUN_DIR = True


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def _spread(s: Stats) -> str:
    return f"IQR {_ms(s.q1)}-{_ms(s.q3)}, min {_ms(s.min)}, max {_ms(s.max)}"


def _tflops(flops: int, seconds: float, peak: Peak) -> str:
    achieved = flops / seconds / 1e12
    if peak.tflops is None:
        return f"{achieved:.3g}"
    return f"{achieved:.3g} ({100 * achieved / peak.tflops:.1f}% of {peak.tflops:g})"


def single_table(r: VariantResult, tokens: int, flops: FlopCount, peak: Peak) -> Table:
    table = Table(title=f"{r.name}: {tokens} tokens per call", title_justify="left")
    for col in ("phase", "median ms", "spread (ms)", "tokens/s", "TFLOP/s"):
        table.add_column(col, justify="left" if col in ("phase", "spread (ms)") else "right")
    for phase, s in r.stats.items():
        table.add_row(
            phase,
            _ms(s.median),
            _spread(s),
            f"{tokens / s.median:,.0f}",
            _tflops(flops.of(phase), s.median, peak),
        )
    return table


def noise_warnings(results: Sequence[VariantResult]) -> list[str]:
    """What the timings' own spread says about them: a phase whose IQR is wide, a full step faster
    than a part of it."""
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
        out.append(
            "(the machine is busy or the work too small: rerun with bench.threads=1, more bench.repeats, "
            "or a larger bench.tokens on a quieter machine)"
        )
    return out


def compare_table(results: Sequence[VariantResult], tokens: int) -> Table:
    table = Table(title="interleaved comparison: median ms (ratio to (a))", title_justify="left")
    table.add_column("variant")
    for phase in PHASES:
        table.add_column(phase, justify="right")
    table.add_column("step IQR (ms)", justify="right")
    table.add_column("step tokens/s", justify="right")
    table.add_column("peak MiB", justify="right")
    base = results[0].stats
    for r in results:
        cells = [f"{_ms(r.stats[p].median)} ({r.stats[p].median / base[p].median:.2f}x)" for p in PHASES]
        step = r.stats["step"]
        peak = f"{r.peak_bytes / 2**20:,.1f}" if r.peak_bytes is not None else "n/a"
        table.add_row(r.name, *cells, f"{_ms(step.q1)}-{_ms(step.q3)}", f"{tokens / step.median:,.0f}", peak)
    return table


def split_summary(split: SplitPlan, shown: int = 4) -> str:
    steps = split.original.steps
    cuts = ", ".join(f"{steps[k].name!r} (model.ops[{k}])" for k in split.cuts[:shown])
    more = f" and {len(split.cuts) - shown} more" if len(split.cuts) > shown else ""
    bridged = "; ".join(f"{b.channel} -> {', '.join(b.inputs)}" for b in split.bridges[:shown]) or "none"
    if len(split.bridges) > shown:
        bridged += f"; and {len(split.bridges) - shown} more"
    parts = f"(b) {len(split.parts)} parts, cut before step(s) {cuts}{more}"
    return printable(f"{parts}; channels passed by the caller: {bridged}")


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


def main(analysis: Analysis, console: Console) -> Outcome:
    session = start(analysis, console)
    settings: BenchSettings = session.section("bench")
    check_split_at(session.plan, settings.split_at)
    with session.parallel("bench", ("bench.tokens", settings.tokens), settings.seq_len) as par:
        if par.is_parallel and settings.compare:
            raise ConfigError(
                [
                    error(
                        "bench.compare",
                        "conflicting-settings",
                        "bench.compare times variants in one process, but the parallel sizes ask for "
                        f"{par.settings.world_size} processes",
                        "drop it under torchrun",
                    )
                ]
            )
        return _bench(session, settings, console, par)


def _bench(session: Session, settings: BenchSettings, console: Console, par: ParallelContext) -> Outcome:
    plan, device, dtype, seed = session.plan, par.device(session.device), session.dtype, session.seed
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)

    count = 3 if settings.compare else 1
    needed = estimate(
        plan,
        dtype,
        tokens=settings.tokens,
        models=count,
        trained=count,
        optimizer=settings.optimizer,
        seq_len=settings.seq_len,
        fused_attention=fused_attention(session.engine, session.kernels, device, dtype),
    )
    check_fits(needed, device, f"benchmarking {plan.name}", "lower bench.tokens or make the model smaller")

    torch.manual_seed(seed)
    variants, split = build_variants(
        plan,
        engine=session.engine,
        kernels=session.kernels,
        device=device,
        dtype=dtype,
        optimizer=settings.optimizer,
        lr=settings.lr,
        compare=settings.compare,
        split_at=settings.split_at,
        recipe=session.engine_recipe,
        parallel=par,
    )
    generator = torch.Generator().manual_seed(seed)
    seq_len = settings.seq_len
    x = sample_x(plan, settings.tokens, generator=generator, device=device, dtype=dtype, seq_len=seq_len)
    inputs = sample_public_inputs(
        plan, settings.tokens, generator=generator, device=device, dtype=dtype, seq_len=seq_len
    )
    x, inputs = par.local_rows(x), par.local_inputs(inputs)
    tokens = x.numel() // x.shape[-1]  # this rank's rows ([batch, seq, features]: batch * seq)
    if plan.num_params == 0:
        # Without parameters only the input's gradient gives backward something to compute.
        x.requires_grad_(True)
        console.print(
            f"{plan.name} has no parameters: backward computes the gradient of x, and the step phase "
            "has no optimizer update",
            markup=False,
        )
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    # TE runs float32 GEMMs as TF32 on a GPU: say so, since float32 is the default dtype.
    te_gemms = session.engine == "te" and session.kernels == "te" and device.type == "cuda"
    dtype_name = str(dtype).removeprefix("torch.") + (
        " (TF32 GEMMs in TE)" if dtype == torch.float32 and te_gemms else ""
    )
    if par.is_parallel:
        console.print(
            f"parallel: {par.settings.describe()}; {settings.tokens} tokens per step in all, rank 0 reads "
            f"{tokens}; rank 0's phases first, then every rank's steps",
            markup=False,
        )
    console.print(
        f"{printable(plan.name)}: {dev_name}, dtype {dtype_name}, {tokens} tokens, "
        f"{settings.warmup} warm-up + {settings.repeats} timed repeats per phase, "
        f"optimizer {settings.optimizer}, "
        f"{torch.get_num_threads()} CPU thread(s)",
        markup=False,
    )
    if split is not None:
        console.print(split_summary(split), markup=False)

    te_kernels = session.engine == "te" and session.kernels == "te"
    flops = _count_flops(variants[0], x, inputs, plan, tokens, te_kernels, seq_len)
    total = len(PHASES) * settings.repeats * len(variants)
    columns = (TextColumn("timing"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    TIMER.enabled = par.is_parallel
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("timing", total=total)
        results = run_benchmark(
            variants,
            x,
            inputs,
            device=device,
            warmup=settings.warmup,
            repeats=settings.repeats,
            on_sample=lambda: progress.advance(task),
            comm_clock=(lambda: TIMER.seconds) if par.is_parallel else None,
        )
    TIMER.enabled = False

    recipe_kind = str(session.recipe.get("kind")) if te_kernels else None
    peak = peak_for(device, gemm_precision(dtype, te_gemms=te_gemms, recipe_kind=recipe_kind))
    console.print(single_table(results[0], tokens, flops, peak))
    rows = gather_rank_results(par, results[0], tokens) if par.is_parallel else None
    if rows is not None:
        console.print(rank_table(rows, settings.tokens))
    if settings.compare:
        console.print(compare_table(results, settings.tokens))
    if device.type == "cuda":
        peak_mib = (results[0].peak_bytes or 0) / 2**20
        console.print(f"peak memory of one step (max_memory_allocated): {peak_mib:,.1f} MiB", markup=False)
    else:
        console.print(
            f"peak memory: n/a per phase on CPU; process peak RSS so far {process_peak_rss_mib():,.0f} MiB",
            markup=False,
        )
    note = f" ({flops.note})" if flops.note else ""
    console.print(
        f"FLOPs per call: forward {flops.forward:,}, backward {flops.backward:,}, from {flops.source}{note}; "
        f"{peak.describe()}",
        markup=False,
        soft_wrap=True,
    )
    methods = results[0].methods
    for phase in PHASES:
        if phase in methods:
            console.print(f"{phase} timed with {methods[phase]}", markup=False, soft_wrap=True)
    warnings = noise_warnings(results)
    if settings.repeats < 2:
        warnings.append("1 sample per phase: no spread to judge the times by (bench.repeats >= 5 is better)")
    for line in warnings:
        console.print(f"warning: {line}", style="yellow", markup=False, soft_wrap=True)
    if par.is_main:
        report = report_data(plan, session, par, results, tokens, flops, peak, warnings, rows, dev_name)
        for path in _write_reports(report, settings, session):
            console.print(f"wrote {printable(str(path))}", markup=False, soft_wrap=True)
    return Outcome(0, sweep_summary(results, tokens))


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
        return bench_loss(variant.model(x, **inputs), variant.loss_outputs)

    count = count_flops(forward, plan, tokens, te_kernels=te_kernels, seq_len=seq_len)
    variant.optimizer.zero_grad(set_to_none=True)
    if x.grad is not None:
        x.grad = None
    return count


def sweep_summary(results: Sequence[VariantResult], tokens: int) -> dict[str, float | str]:
    """This job's numbers for the table that ends a sweep (``bench -m ...``): (a)'s median per phase
    (``tokens``: the rows this process read)."""
    first = results[0]
    out: dict[str, float | str] = {f"{phase} ms": first.stats[phase].median * 1e3 for phase in PHASES}
    out["step tokens/s"] = tokens / first.stats["step"].median
    return out


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


def report_data(
    plan: Plan,
    session: Session,
    par: ParallelContext,
    results: Sequence[VariantResult],
    tokens: int,
    flops: FlopCount,
    peak: Peak,
    warnings: Sequence[str],
    rows: list[dict[str, Any]] | None,
    device_name: str,
) -> dict[str, Any]:
    """The numbers as JSON data, for scripts (``bench/parallel_scaling.py``) and for keeping."""
    from te_assembly.jobs.benchmark.throughput import aggregate

    first = results[0]
    report: dict[str, Any] = {
        "model": plan.name,
        "device": device_name,
        "engine": session.engine,
        "kernels": session.kernels,
        "dtype": str(session.dtype).removeprefix("torch."),
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
            for r in results
        ],
        "warnings": list(warnings),
        "parallel": par.settings.sizes(),
        "world_size": par.settings.world_size,
        "rank0": {"tokens": tokens, "phases": {p: s.median for p, s in first.stats.items()}},
    }
    if rows is not None:
        report["ranks"] = rows
        report["job"] = aggregate(rows, tokens * par.settings.row_shards)
    else:
        step = first.stats["step"].median
        report["job"] = {"step_s": step, "tokens_per_s": tokens / step, "comm_share": 0.0}
    return report


def _write_reports(report: dict[str, Any], settings: BenchSettings, session: Session) -> list[Path]:
    """``bench.json`` and ``config.yaml`` in the run directory, and ``bench.report`` if set."""
    text = json.dumps(report, indent=1)
    job = job_dir.current("bench")
    out = job_dir.claim(job)
    written = [job_dir.write_config(out, session.analysis.resolved.as_config(), job)]
    written.append(write_text_atomic(out / "bench.json", text))
    if settings.report is not None:
        written.append(write_text_atomic(Path(settings.report), text))
    return written
