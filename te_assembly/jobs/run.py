"""``run`` (the default command's job): build the model and run a few forward+backward steps on
synthetic data.

Per step: a fresh ``x`` of ``run.tokens`` rows (``[run.tokens, in_features]``, or ``[run.tokens /
run.seq_len, run.seq_len, in_features]`` for a model that takes sequences) and a sample for every public
input (``engines/data.py``), all seeded by the target's seed. The loss (``jobs/objective.py``) is

    y.square().mean()
    + every public output of a loss slot (``is_loss`` in the catalog, e.g. TopKRouter's aux_loss,
      whatever its channel is called), added as is (it is already weighted by the op, e.g.
      ``aux_loss_coeff``)
    + the mean square of every other public float output,

so that gradients also come back from the caller for public outputs, as they would in training. For a
language model (``x`` random token ids) the first term is the next-token cross-entropy against ``x``
shifted by one, as training computes it.
The result holds output statistics of the last step, the gradient that reached each channel (the sum
over its consumers, plus the caller for a public channel: reference engine only), the parameter-gradient
norm and the median step time (first step excluded when there are several).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from te_assembly.analysis.plan import Plan
from te_assembly.analysis.settings import RunSettings
from te_assembly.engines.base import AssembledModel, loss_output_names
from te_assembly.engines.data import DEFAULT_SEQ_LEN
from te_assembly.engines.target import Target, as_target
from te_assembly.errors import NonFiniteError
from te_assembly.jobs import objective
from te_assembly.jobs.events import Advanced, Built, OnEvent, ignore

TASK = "forward+backward"


@dataclass
class StepResult:
    y: torch.Tensor
    extras: dict[str, torch.Tensor]
    loss: float
    seconds: float


@dataclass(frozen=True)
class OutputStats:
    """One row of the outputs table: the main output ``y`` or a public output, last step."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    mean: float | None
    std: float | None
    """None for a single element."""
    absmax: float | None


@dataclass(frozen=True)
class ChannelGrad:
    """The gradient that reached a channel's producer: the sum over its consumers (and the caller, for
    a public channel)."""

    name: str
    producer: str
    summed_over: tuple[str, ...]
    norm: float | None
    """None when there is no number: an int channel, or no gradient reached it (``why``)."""
    why: str = ""


@dataclass
class RunResult:
    model: str
    engine: str
    steps: list[StepResult]
    outputs: list[OutputStats]
    channel_grads: list[ChannelGrad] | None
    """None when the engine does not record channel tensors (only the reference engine does)."""
    grad_norm: float
    step_seconds: float
    """Median step time (``median_step_time``)."""
    notes: list[str] = field(default_factory=list)

    @property
    def loss(self) -> float:
        return self.steps[-1].loss


def loss_of(
    y: torch.Tensor,
    extras: Mapping[str, torch.Tensor],
    loss_names: Sequence[str],
    x: torch.Tensor | None = None,
) -> torch.Tensor:
    """The run's loss (see the module docstring), in float32 at least. ``loss_names``: the public
    outputs that are loss terms (``engines.base.loss_output_names``); ``x``: the model's input (token ids
    make the main term the next-token cross-entropy)."""
    return objective.objective(y, extras, loss_names, other_outputs=True, x=x)


def run_steps(
    model: AssembledModel,
    plan: Plan,
    target: Target,
    *,
    steps: int,
    tokens: int,
    seq_len: int = DEFAULT_SEQ_LEN,
    on_event: OnEvent = ignore,
) -> list[StepResult]:
    """``steps`` forward+backward passes on fresh synthetic data drawn from ``target.seed``; gradients
    are left from the last. A parallel target: each rank runs its rows of every batch (``tokens`` is the
    whole batch); the loss shown is the mean over ranks."""
    generator = torch.Generator().manual_seed(target.seed)
    loss_names = loss_output_names(plan)
    results: list[StepResult] = []
    par = target.parallel
    forward = par.wrap(model) if par is not None else model
    for step in range(steps):
        x, inputs = target.sample(plan, tokens, generator, seq_len)
        x.requires_grad_(x.is_floating_point())  # token ids have no gradient
        for tensor in inputs.values():
            if tensor.is_floating_point():
                tensor.requires_grad_(True)
        model.zero_grad(set_to_none=True)
        target.sync()
        start = time.perf_counter()
        y, extras = forward(x, **inputs)
        loss = loss_of(y, extras, loss_names, x)
        loss.backward()
        if par is not None:
            par.finish_grads(model)
        target.sync()
        seconds = time.perf_counter() - start
        value = par.mean(loss.item()) if par is not None else loss.item()
        if not math.isfinite(value):
            raise NonFiniteError(step, "loss")
        detached = {k: v.detach() for k, v in extras.items()}
        results.append(StepResult(y.detach(), detached, value, seconds))
        on_event(Advanced(TASK, step + 1, steps, f"{TASK}  loss {value:.4g}"))
    return results


def median_step_time(results: Sequence[StepResult]) -> float:
    """Median seconds per step; the first step (allocator and kernel warm-up) is left out if possible."""
    times = [r.seconds for r in results]
    return statistics.median(times[1:] if len(times) > 1 else times)


def step_time_note(steps: int) -> str:
    """What ``median_step_time`` of ``steps`` results measured, in words."""
    if steps == 1:
        return "1 step, warm-up included"
    if steps == 2:
        return "1 timed step after a warm-up step"
    return f"median of {steps - 1} timed steps after a warm-up step"


def output_stats(result: StepResult) -> list[OutputStats]:
    rows = []
    for name, value in [("y", result.y), *result.extras.items()]:
        v = value.double()
        rows.append(
            OutputStats(
                name,
                tuple(value.shape),
                str(value.dtype).removeprefix("torch."),
                v.mean().item() if v.numel() else None,
                v.std().item() if v.numel() > 1 else None,
                v.abs().max().item() if v.numel() else None,
            )
        )
    return rows


def channel_grads(plan: Plan, channels: Mapping[str, torch.Tensor]) -> list[ChannelGrad]:
    """d loss / d channel, summed over all its consumers (and the caller, for a public channel)."""
    steps = plan.steps_by_index
    rows = []
    for name, channel in plan.channels.items():
        producer = f"{steps[channel.producer.step].name}.{channel.producer.slot_name}"
        sources = [f"{steps[r.step].name}.{r.slot_name}" for r in channel.consumers]
        if channel.public:
            sources.append("caller")
        tensor = channels.get(name)
        if channel.dtype == "int":
            rows.append(ChannelGrad(name, producer, tuple(sources), None, "int: no gradient"))
        elif tensor is None or tensor.grad is None:
            rows.append(ChannelGrad(name, producer, tuple(sources), None, "none reached it"))
        else:
            rows.append(ChannelGrad(name, producer, tuple(sources), tensor.grad.double().norm().item()))
    return rows


def parameter_grad_norm(model: torch.nn.Module) -> float:
    norms = [p.grad.double().norm() for p in model.parameters() if p.grad is not None]
    return torch.stack(norms).norm().item() if norms else 0.0


def run(
    plan: Plan, target: Target | str, settings: RunSettings | None = None, *, on_event: OnEvent = ignore
) -> RunResult:
    """Build ``plan`` on ``target`` (a ``Target``, or an engine name) and run ``settings.steps``
    forward+backward steps. Raises, before anything is allocated, ``ResourceError`` when the model and a
    batch cannot fit; ``NonFiniteError`` for a non-finite loss."""
    target = as_target(target)
    settings = settings or RunSettings()
    tokens, seq_len = settings.tokens, settings.seq_len
    target.check_fits(
        plan,
        f"running {plan.name}",
        "lower run.tokens or make the model smaller",
        tokens=tokens,
        trained=1,
        seq_len=seq_len,
    )
    model = target.build(plan, seed=target.seed)
    on_event(Built(model))
    notes = []
    record = getattr(model, "record_channels", None)
    if model.runs_as_units:  # compiled units: no retained channel tensors inside a compiled graph
        record = None
        notes.append(
            "compile=true: step 1 includes torch.compile's tracing and code generation, later steps run the "
            "compiled units; channel gradients are not recorded"
        )
    elif target.parallel is not None and target.parallel.is_sharded:  # FSDP2 runs it as units too
        record = None
        notes.append("parallel.shard: FSDP2 runs the model in units; channel gradients are not recorded")
    if record is not None:
        record(True)
    results = run_steps(
        model, plan, target, steps=settings.steps, tokens=tokens, seq_len=seq_len, on_event=on_event
    )
    grads = channel_grads(plan, getattr(model, "channel_tensors", {})) if record is not None else None
    return RunResult(
        model=plan.name,
        engine=model.engine,
        steps=results,
        outputs=output_stats(results[-1]),
        channel_grads=grads,
        grad_norm=target.parallel.grad_norm(model)
        if target.parallel is not None
        else parameter_grad_norm(model),
        step_seconds=median_step_time(results),
        notes=notes,
    )


__all__ = [
    "ChannelGrad",
    "OutputStats",
    "RunResult",
    "StepResult",
    "loss_of",
    "median_step_time",
    "run",
    "run_steps",
    "step_time_note",
]
