"""Timing samples and their summary.

Forward and the full step are timed with ``torch.utils.benchmark.Timer``: it runs the statement with
torch's thread setting pinned and, on a GPU, synchronizes the device around the timed region, so a
sample covers the kernels and not just their launch. Each sample is ``Timer.timeit(number=1)``: two
untimed runs of the statement (Timer's own warm-up), then one timed run. Samples of several models are
taken in turns (``runner.py``), and merged per model with ``Measurement.merge``.

Backward is timed by hand (``timed``: device synchronized before and after): a backward pass frees the
graph it runs through, and ``Timer`` runs its statement at least twice per setup (``timeit``'s warm-up,
``blocked_autorange``'s blocks), which a second backward through the same graph refuses. Each backward
sample gets a fresh forward, untimed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from te_assembly.engines.target import synchronize

NOISE_THRESHOLD = 0.1
"""A phase whose IQR is more than this fraction of its median is reported as noise (the threshold at
which ``torch.utils.benchmark.Measurement`` warns of "system fluctuation")."""


@dataclass(frozen=True)
class Stats:
    """Seconds: median and spread of repeated samples."""

    median: float
    q1: float
    q3: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stats:
        """Quartiles by linear interpolation (``torch.quantile``'s, as ``Measurement`` computes them)."""
        if not samples:
            raise ValueError("no samples")
        ordered = sorted(samples)
        if len(ordered) >= 2:
            q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
        else:
            q1 = q3 = ordered[0]
        return cls(statistics.median(ordered), q1, q3, ordered[0], ordered[-1], len(ordered))

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def relative_spread(self) -> float:
        """IQR / median."""
        return self.iqr / self.median if self.median > 0 else float("inf")

    @property
    def noisy(self) -> bool:
        """The spread says these samples are noise (``NOISE_THRESHOLD``); one sample has no spread."""
        return self.n >= 2 and self.relative_spread > NOISE_THRESHOLD


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds one call of ``fn`` takes, device work included."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


class PhaseTimer:
    """One phase of one model: a ``torch.utils.benchmark.Timer`` of ``run`` (each sample one timed run
    after two untimed ones), or, for a phase ``Timer`` cannot repeat (backward), ``prepare`` untimed then
    ``run`` timed by hand."""

    def __init__(
        self,
        run: Callable[..., object],
        prepare: Callable[[], object] | None = None,
        *,
        label: str = "",
        phase: str = "",
        device: torch.device,
    ) -> None:
        self.run, self.prepare, self.device = run, prepare, device
        self.uses_timer = prepare is None
        self._timer = None
        if self.uses_timer:
            from torch.utils.benchmark import Timer

            self._timer = Timer(
                stmt="run()",
                globals={"run": run},
                num_threads=torch.get_num_threads(),  # Timer pins 1 thread unless told otherwise
                label=label,
                sub_label=phase,
            )
        self.measurements: list[object] = []
        self.samples: list[float] = []

    def warm_up(self) -> None:
        if self.prepare is None:
            self.run()
        else:
            self.run(self.prepare())

    def sample(self) -> float:
        """One timed run, in seconds."""
        if self._timer is not None:
            measurement = self._timer.timeit(number=1)
            self.measurements.append(measurement)
            seconds = float(measurement.times[0])
        else:
            assert self.prepare is not None
            prepared = self.prepare()
            seconds = timed(lambda: self.run(prepared), self.device)
        self.samples.append(seconds)
        return seconds

    def stats(self) -> Stats:
        if self.measurements:
            from torch.utils.benchmark import Measurement

            merged = Measurement.merge(self.measurements)  # type: ignore[arg-type]
            return Stats.of(list(merged[0].times))
        return Stats.of(self.samples)

    @property
    def method(self) -> str:
        if self.uses_timer:
            return "torch.utils.benchmark.Timer.timeit(number=1) per sample (2 untimed runs, then 1 timed)"
        return (
            "timed by hand (device synchronized): backward frees its graph, and torch.utils.benchmark.Timer "
            "runs a statement at least twice per setup"
        )


__all__ = ["NOISE_THRESHOLD", "PhaseTimer", "Stats", "synchronize", "timed"]
