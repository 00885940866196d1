"""``bench``: forward, backward and full-step (forward + backward + optimizer) times, tokens/s, peak
memory and, on a known GPU, achieved TFLOP/s against the device's dense peak.

``bench.compare=true`` also times, interleaved in the same process, (b) the block cut in two fusers
with the crossing channels returned and passed back by the caller (TE's way before channels) and
(c) the same math as plain PyTorch, and prints ratios to (a).
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

from te_assembly.bench import (
    PEAK_SOURCE,
    PHASES,
    BenchSettings,
    SplitPlan,
    Stats,
    VariantResult,
    build_variants,
    forward_flops,
    peak_tflops,
    run_benchmark,
)
from te_assembly.bench.runner import process_peak_rss_mib
from te_assembly.bench.split import split_points
from te_assembly.cli.commands import Outcome
from te_assembly.cli.commands.session import Session, start
from te_assembly.diagnostics import did_you_mean, error, printable
from te_assembly.engines.data import sample_public_inputs, sample_x
from te_assembly.engines.memory import check_fits, estimate, fused_attention
from te_assembly.errors import ConfigError
from te_assembly.outputs import write_error
from te_assembly.parallel.collectives import TIMER
from te_assembly.parallel.context import ParallelContext
from te_assembly.parallel.throughput import gather_rank_results, rank_table
from te_assembly.plan import Plan
from te_assembly.validate.analysis import COMMON_SECTIONS, Analysis

SECTIONS = {**COMMON_SECTIONS, "bench": BenchSettings}

# Backward does two GEMMs per forward GEMM (data and weight gradients).
FLOP_FACTOR = {"forward": 1, "backward": 2, "step": 3}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def _spread(s: Stats) -> str:
    return f"IQR {_ms(s.q1)}-{_ms(s.q3)}, min {_ms(s.min)}, max {_ms(s.max)}"


def _tflops(flops: int, seconds: float, peak: float | None) -> str:
    if peak is None:
        return "n/a"
    achieved = flops / seconds / 1e12
    return f"{achieved:.1f} ({100 * achieved / peak:.1f}% of {peak:g})"


def single_table(r: VariantResult, tokens: int, flops: int, peak: float | None) -> Table:
    table = Table(title=f"{r.name}: {tokens} tokens per call", title_justify="left")
    for col in ("phase", "median ms", "spread (ms)", "tokens/s", "TFLOP/s"):
        table.add_column(col, justify="left" if col in ("phase", "spread (ms)") else "right")
    for phase, s in r.stats.items():
        table.add_row(
            phase,
            _ms(s.median),
            _spread(s),
            f"{tokens / s.median:,.0f}",
            _tflops(FLOP_FACTOR[phase] * flops, s.median, peak),
        )
    return table


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

    flops = forward_flops(plan, tokens, seq_len)
    peak = peak_tflops(device, dtype, tf32=te_gemms)
    console.print(single_table(results[0], tokens, flops, peak))
    if par.is_parallel:
        rows = gather_rank_results(par, results[0], tokens)
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
    where = f"peak: {PEAK_SOURCE}" if peak is not None else "TFLOP/s: n/a (CPU or a GPU without a peak entry)"
    console.print(f"forward GEMM FLOPs per call: {flops:,} (backward 2x, step 3x); {where}", markup=False)
    if settings.report is not None and par.is_main:
        write_report(settings.report, plan, par, results[0], tokens, rows if par.is_parallel else None)
    return Outcome(0, sweep_summary(results, tokens))


def sweep_summary(results: Sequence[VariantResult], tokens: int) -> dict[str, float | str]:
    """This job's numbers for the table that ends a sweep (``bench -m ...``): (a)'s median per phase
    (``tokens``: the rows this process read)."""
    first = results[0]
    out: dict[str, float | str] = {f"{phase} ms": first.stats[phase].median * 1e3 for phase in PHASES}
    out["step tokens/s"] = tokens / first.stats["step"].median
    return out


def write_report(
    path: str,
    plan: Plan,
    par: ParallelContext,
    result: VariantResult,
    tokens: int,
    rows: list[dict[str, Any]] | None,
) -> None:
    """``bench.report``: the numbers as JSON, for scripts (``bench/parallel_scaling.py``)."""
    from te_assembly.parallel.throughput import aggregate
    from te_assembly.train.checkpoint import write_text_atomic

    report: dict[str, Any] = {
        "model": plan.name,
        "parallel": par.settings.sizes(),
        "world_size": par.settings.world_size,
        "rank0": {"tokens": tokens, "phases": {p: s.median for p, s in result.stats.items()}},
    }
    if rows is not None:
        report["ranks"] = rows
        report["job"] = aggregate(rows, tokens * par.settings.row_shards)
    else:
        step = result.stats["step"].median
        report["job"] = {"step_s": step, "tokens_per_s": tokens / step, "comm_share": 0.0}
    target = Path(path)
    try:
        write_text_atomic(target, json.dumps(report, indent=1))
    except OSError as exc:
        raise write_error(target, exc) from None
