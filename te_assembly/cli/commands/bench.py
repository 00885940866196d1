"""``bench``: the ``bench`` job (``jobs/bench/``: forward, backward and full-step times, tokens/s,
peak memory, achieved TFLOP/s and FLOPs, ``bench.compare`` variants interleaved) with a progress bar,
then its result as tables and warnings.

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
from rich.table import Table

from te_assembly.analysis.analyze import COMMON_SECTIONS, Analysis
from te_assembly.cli import job_dir
from te_assembly.cli.commands import Outcome
from te_assembly.cli.commands.session import Session, progress_bar, start
from te_assembly.diagnostics import printable
from te_assembly.engines.target import Target
from te_assembly.files.ownership import check_not_a_run, check_not_theirs
from te_assembly.files.write import write_text_atomic
from te_assembly.jobs.bench.flops import FlopCount
from te_assembly.jobs.bench.job import Measuring, bench, check_settings, check_split_at
from te_assembly.jobs.bench.peaks import Peak
from te_assembly.jobs.bench.runner import PHASES, VariantResult, process_peak_rss_mib
from te_assembly.jobs.bench.settings import BenchSettings
from te_assembly.jobs.bench.split import SplitPlan
from te_assembly.jobs.bench.timing import Stats
from te_assembly.jobs.events import Note

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


def rank_table(rows: list[dict[str, Any]], global_tokens: int) -> Table:
    table = Table(title="per rank: full step (forward + backward + optimizer)", title_justify="left")
    for col in ("rank", "data/expert/tensor", "rows", "median ms", "tokens/s", "in collectives"):
        table.add_column(col, justify="right")
    for r in rows:
        d, e, t = r["coords"]
        table.add_row(
            str(r["rank"]),
            f"{d}/{e}/{t}",
            str(r["tokens"]),
            f"{r['step'] * 1e3:.3f}",
            f"{r['tokens'] / r['step']:,.0f}",
            f"{r['comm']:.0%}",
        )
    slowest = max(r["step"] for r in rows)
    comm = sum(r["comm"] for r in rows) / len(rows)
    table.add_row(
        "job",
        "",
        str(global_tokens),
        f"{slowest * 1e3:.3f}",
        f"{global_tokens / slowest:,.0f}",
        f"{comm:.0%} (mean)",
    )
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


def _fusion_line(fusions: list[dict[str, Any]]) -> str:
    """What TE fused (bench.json's ``fusions``), and whether it is what ``explain`` predicted."""
    fired = [
        f"{f['op']} ({', '.join(f['steps'])})"
        for entry in fusions
        for d in ("forward", "backward")
        for f in entry[d]
    ]
    same = all(
        [f["op"] for f in entry[d]] == entry["predicted"][d]
        for entry in fusions
        for d in ("forward", "backward")
    )
    what = "; ".join(fired) if fired else "none"
    return printable(f"TE fusions that fired: {what} ({'as' if same else 'NOT as'} explain predicts)")


def main(analysis: Analysis, console: Console) -> Outcome:
    session = start(analysis, console)
    settings: BenchSettings = session.section("bench")
    check_split_at(session.plan, settings.split_at)
    job_dir.check_claimable(job_dir.current("bench"))  # where it writes, before any timing
    if settings.report is not None:
        check_not_theirs(Path(settings.report), "bench.report")
        check_not_a_run(Path(settings.report).parent, "bench.report")
    with session.distributed("bench", ("bench.tokens", settings.tokens), settings.seq_len) as target:
        check_settings(session.plan, settings, target.context(session.plan).settings.world_size)
        return _bench(session, target, settings, console)


def _bench(session: Session, target: Target, settings: BenchSettings, console: Console) -> Outcome:
    plan, par = session.plan, target.context(session.plan)
    with progress_bar(console, transient=True) as progress:

        def on_event(event: object) -> None:
            if isinstance(event, Note):
                console.print(event.text, markup=False)
            elif isinstance(event, Measuring):
                _describe(plan.name, event, target, settings, console)
            progress.on_event(event)

        result = bench(plan, target, settings, on_event=on_event)
    console.print(single_table(result.results[0], result.tokens, result.flops, result.peak))
    if result.ranks is not None:
        console.print(rank_table(result.ranks, settings.tokens))
    if settings.compare:
        console.print(compare_table(result.results, settings.tokens))
    first = result.results[0]
    if target.device.type == "cuda":
        peak_mib = (first.peak_bytes or 0) / 2**20
        console.print(f"peak memory of one step (max_memory_allocated): {peak_mib:,.1f} MiB", markup=False)
    else:
        console.print(
            f"peak memory: n/a per phase on CPU; process peak RSS so far {process_peak_rss_mib():,.0f} MiB",
            markup=False,
        )
    flops = result.flops
    note = f" ({flops.note})" if flops.note else ""
    console.print(
        f"FLOPs per call: forward {flops.forward:,}, backward {flops.backward:,}, from {flops.source}{note}; "
        f"{result.peak.describe()}",
        markup=False,
        soft_wrap=True,
    )
    for phase in PHASES:
        if phase in first.methods:
            console.print(f"{phase}: {first.methods[phase]}", markup=False, soft_wrap=True)
    if result.fusions:
        console.print(_fusion_line(result.fusions), markup=False, soft_wrap=True)
    for line in result.warnings:
        console.print(f"warning: {line}", style="yellow", markup=False, soft_wrap=True)
    if par.is_main:
        for path in _write_reports(result.report, settings, session):
            console.print(f"wrote {printable(str(path))}", markup=False, soft_wrap=True)
    return Outcome(0, result.summary)


def _describe(model: str, what: Measuring, target: Target, settings: BenchSettings, console: Console) -> None:
    """What is about to be timed, before the progress bar."""
    # TE runs float32 GEMMs as TF32 on a GPU: say so, since float32 is the default dtype.
    tf32 = " (TF32 GEMMs in TE)" if target.dtype == torch.float32 and target.te_gemms else ""
    if target.is_parallel:
        assert target.parallel is not None
        console.print(
            f"parallel: {target.parallel.settings.describe()}; {settings.tokens} tokens per step in all, "
            f"rank 0 reads {what.tokens}; rank 0's phases first, then every rank's steps",
            markup=False,
        )
    console.print(
        f"{printable(model)}: {what.device_name}, dtype {target.dtype_name}{tf32}, "
        f"{what.tokens} tokens, {settings.warmup} warm-up + {settings.repeats} timed repeats per phase, "
        f"optimizer {settings.optimizer}, {torch.get_num_threads()} CPU thread(s)",
        markup=False,
    )
    if what.split is not None:
        console.print(split_summary(what.split), markup=False)


def _write_reports(report: dict[str, Any], settings: BenchSettings, session: Session) -> list[Path]:
    """``bench.json`` and ``config.yaml`` in the run directory, and ``bench.report`` if set."""
    text = json.dumps(report, indent=1)
    job = job_dir.current("bench")
    out = job_dir.claim(job)
    written = [job_dir.write_config(out, session.analysis.resolved.as_config(), job)]
    written.append(write_text_atomic(out / "bench.json", text))
    if settings.report is not None:
        file = Path(settings.report)
        check_not_theirs(file, "bench.report")
        check_not_a_run(file.parent, "bench.report")
        written.append(write_text_atomic(file, text))
    return written
