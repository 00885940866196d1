"""Time forward, backward and a full training step of one or more models on the same inputs.

Variants are timed interleaved: every repeat runs each variant once, in a rotating order, so slow
drifts of the machine (clocks, other processes) hit all of them alike.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from te_assembly.engines.base import ModelOutput
from te_assembly.jobs import objective
from te_assembly.jobs.bench.timing import PhaseTimer, Stats, synchronize
from te_assembly.jobs.optimizer import NothingToStep

PHASES = ("forward", "backward", "step")
ModelFn = Callable[..., ModelOutput]


@dataclass
class Variant:
    name: str
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | NothingToStep
    loss_outputs: tuple[str, ...] = ()
    """Public outputs that are loss terms (``engines.base.loss_output_names``), added to the loss."""
    after_backward: Callable[[], None] | None = None
    """Parallel runs: gradient reductions that follow backward (``ParallelContext.finish_grads``)."""


@dataclass
class VariantResult:
    name: str
    stats: dict[str, Stats] = field(default_factory=dict)
    """Phase -> seconds."""
    peak_bytes: int | None = None
    """CUDA ``max_memory_allocated`` during one full step; None on CPU."""
    comm_share: dict[str, float] = field(default_factory=dict)
    """Phase -> fraction of the samples' wall time spent in collectives (parallel runs with a comm
    clock)."""
    methods: dict[str, str] = field(default_factory=dict)
    """Phase -> how it was timed (``timing.PhaseTimer.method``)."""


def bench_loss(out: ModelOutput, loss_names: Sequence[str], x: torch.Tensor | None = None) -> torch.Tensor:
    """Mean square of ``y`` plus every public loss output (``jobs/objective.py``): something every
    output's gradient flows from. For a language model (``x`` token ids), the next-token cross-entropy
    a training step computes (labels: ``x`` shifted by one), so its buffers are timed too."""
    return objective.objective(out.y, out.extras, loss_names, x=x)


def _forward(v: Variant, x: torch.Tensor, inputs: Mapping[str, torch.Tensor]) -> ModelOutput:
    return v.model(x, **inputs)


def phase_timer(
    phase: str, v: Variant, x: torch.Tensor, inputs: Mapping[str, torch.Tensor], device: torch.device
) -> PhaseTimer:
    """The timer of one phase of one variant (``timing.py``: what is timed, and how)."""
    if phase == "forward":
        return PhaseTimer(lambda: _forward(v, x, inputs), label=v.name, phase=phase, device=device)
    if phase == "backward":

        def prepare() -> torch.Tensor:  # untimed: a fresh graph for each backward
            v.optimizer.zero_grad(set_to_none=True)
            return bench_loss(_forward(v, x, inputs), v.loss_outputs, x)

        def backward(loss: torch.Tensor) -> None:
            loss.backward()
            if v.after_backward is not None:
                v.after_backward()

        return PhaseTimer(backward, prepare, label=v.name, phase=phase, device=device)

    def step() -> None:
        v.optimizer.zero_grad(set_to_none=True)
        bench_loss(_forward(v, x, inputs), v.loss_outputs, x).backward()
        if v.after_backward is not None:
            v.after_backward()
        v.optimizer.step()

    return PhaseTimer(step, label=v.name, phase=phase, device=device)


def _peak_bytes(
    v: Variant, x: torch.Tensor, inputs: Mapping[str, torch.Tensor], device: torch.device
) -> int | None:
    if device.type != "cuda":
        return None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    phase_timer("step", v, x, inputs, device).warm_up()
    synchronize(device)
    return int(torch.cuda.max_memory_allocated(device))


def run_benchmark(
    variants: Sequence[Variant],
    x: torch.Tensor,
    inputs: Mapping[str, torch.Tensor],
    *,
    device: torch.device,
    warmup: int,
    repeats: int,
    phases: Sequence[str] = PHASES,
    on_sample: Callable[[], None] | None = None,
    comm_clock: Callable[[], float] | None = None,
) -> list[VariantResult]:
    """Median and spread per variant and phase, plus CUDA peak memory of a full step. The variants take
    turns, one sample each in a rotating order, so a drift of the machine hits all of them alike.
    ``comm_clock``: seconds spent in collectives so far (parallel runs), for each phase's share of time
    in collectives."""
    if repeats < 1 or warmup < 0:
        raise ValueError("repeats must be >= 1 and warmup >= 0")
    results = [VariantResult(v.name) for v in variants]
    for v, r in zip(variants, results, strict=True):
        r.peak_bytes = _peak_bytes(v, x, inputs, device)
    for phase in phases:
        timers = [phase_timer(phase, v, x, inputs, device) for v in variants]
        for t in timers:
            for _ in range(warmup):
                t.warm_up()
        comm = [0.0 for _ in variants]
        wall = [0.0 for _ in variants]
        for rep in range(repeats):
            order = [(rep + i) % len(variants) for i in range(len(variants))]
            for i in order:
                before = comm_clock() if comm_clock is not None else 0.0
                began = time.perf_counter()
                timers[i].sample()
                wall[i] += time.perf_counter() - began  # the untimed runs of a sample too
                comm[i] += comm_clock() - before if comm_clock is not None else 0.0
                if on_sample is not None:
                    on_sample()
        for r, t, c, w in zip(results, timers, comm, wall, strict=True):
            r.stats[phase] = t.stats()
            r.methods[phase] = t.method
            if comm_clock is not None:
                r.comm_share[phase] = c / w if w > 0 else 0.0
    return results


def process_peak_rss_mib() -> float:
    """Peak resident memory of this process so far (Linux reports KiB), for CPU runs."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
