"""``run`` (the default command): build the model and run a few forward+backward steps on synthetic data.

Per step: a fresh ``x`` of ``run.tokens`` rows (``[run.tokens, in_features]``, or ``[run.tokens / run.seq_len,
run.seq_len, in_features]`` for a model that takes sequences) and a sample for every public input
(``te_assembly.engines.data``), all seeded by ``seed``. The loss is

    y.square().mean()
    + every public output of a loss slot (``is_loss`` in the catalog, e.g. TopKRouter's aux_loss,
      whatever its channel is called), added as is (it is already weighted by the op, e.g.
      ``aux_loss_coeff``)
    + the mean square of every other public float output,

so that gradients also come back from the caller for public outputs, as they would in training.
After the last step it prints output statistics, the gradient that reached each channel (the sum over
its consumers, plus the caller for a public channel: reference engine only), the parameter-gradient
norm and the median step time (first step excluded when there are several).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from te_assembly.analysis.analyze import DEFAULT_SECTIONS, Analysis
from te_assembly.analysis.plan import Plan
from te_assembly.analysis.settings import RunSettings
from te_assembly.cli.commands.session import Session, start
from te_assembly.diagnostics import printable
from te_assembly.engines import build
from te_assembly.engines.base import AssembledModel, loss_output_names, loss_precision
from te_assembly.engines.data import DEFAULT_SEQ_LEN, sample_public_inputs, sample_x
from te_assembly.engines.memory import check_fits, estimate, fused_attention
from te_assembly.engines.parallel.context import ParallelContext
from te_assembly.errors import NonFiniteError
from te_assembly.views.explain import plan_tables

SECTIONS = DEFAULT_SECTIONS


@dataclass
class StepResult:
    y: torch.Tensor
    extras: dict[str, torch.Tensor]
    loss: float
    seconds: float


def loss_of(y: torch.Tensor, extras: Mapping[str, torch.Tensor], loss_names: Sequence[str]) -> torch.Tensor:
    """The run's loss (see the module docstring), in float32 at least (``loss_precision``).
    ``loss_names``: the public outputs that are loss terms (``engines.base.loss_output_names``)."""
    loss = loss_precision(y).square().mean()
    for name, value in extras.items():
        if not value.is_floating_point():
            continue
        if name in loss_names:
            loss = loss + loss_precision(value).sum()
        else:
            loss = loss + loss_precision(value).square().mean()
    return loss


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_steps(
    model: AssembledModel,
    plan: Plan,
    *,
    steps: int,
    tokens: int,
    seed: int,
    device: torch.device,
    dtype: torch.dtype,
    progress: Progress | None = None,
    parallel: ParallelContext | None = None,
    seq_len: int = DEFAULT_SEQ_LEN,
) -> list[StepResult]:
    """``steps`` forward+backward passes on fresh synthetic data; gradients are left from the last.
    ``parallel``: each rank runs its rows of every batch (``tokens`` is the whole batch); the loss shown
    is the mean over ranks."""
    generator = torch.Generator().manual_seed(seed)
    loss_names = loss_output_names(plan)
    results: list[StepResult] = []
    task = progress.add_task("forward+backward", total=steps) if progress is not None else None
    forward = parallel.wrap(model) if parallel is not None else model
    for step in range(steps):
        x = sample_x(plan, tokens, generator=generator, device=device, dtype=dtype, seq_len=seq_len)
        inputs = sample_public_inputs(
            plan, tokens, generator=generator, device=device, dtype=dtype, seq_len=seq_len
        )
        if parallel is not None:
            x, inputs = parallel.local_rows(x), parallel.local_inputs(inputs)
        x.requires_grad_(True)
        for tensor in inputs.values():
            if tensor.is_floating_point():
                tensor.requires_grad_(True)
        model.zero_grad(set_to_none=True)
        _sync(device)
        start = time.perf_counter()
        y, extras = forward(x, **inputs)
        loss = loss_of(y, extras, loss_names)
        loss.backward()
        if parallel is not None:
            parallel.finish_grads(model)
        _sync(device)
        seconds = time.perf_counter() - start
        value = parallel.mean(loss.item()) if parallel is not None else loss.item()
        if not math.isfinite(value):
            raise NonFiniteError(step, "loss")
        detached = {k: v.detach() for k, v in extras.items()}
        results.append(StepResult(y.detach(), detached, value, seconds))
        if progress is not None and task is not None:
            progress.update(task, advance=1, description=f"forward+backward  loss {value:.4g}")
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


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def output_table(result: StepResult) -> Table:
    table = Table(title="outputs (last step)", title_justify="left")
    for col in ("output", "shape", "dtype", "mean", "std", "absmax"):
        table.add_column(col, justify="right" if col in ("mean", "std", "absmax") else "left")
    for name, value in [("y", result.y), *result.extras.items()]:
        v = value.double()
        std = _fmt(v.std().item()) if v.numel() > 1 else "-"
        mean = _fmt(v.mean().item()) if v.numel() else "-"
        absmax = _fmt(v.abs().max().item()) if v.numel() else "-"
        dtype = str(value.dtype).removeprefix("torch.")
        table.add_row(Text(printable(name)), str(tuple(value.shape)), dtype, mean, std, absmax)
    return table


def channel_grad_table(plan: Plan, channels: Mapping[str, torch.Tensor]) -> Table:
    """d loss / d channel, summed over all its consumers (and the caller, for a public channel)."""
    table = Table(title="gradient reaching each channel's producer (last step)", title_justify="left")
    for col in ("channel", "producer", "summed over", "grad norm"):
        table.add_column(col, justify="right" if col == "grad norm" else "left")
    steps = plan.steps_by_index
    for name, channel in plan.channels.items():
        producer = printable(f"{steps[channel.producer.step].name}.{channel.producer.slot_name}")
        sources = [printable(f"{steps[r.step].name}.{r.slot_name}") for r in channel.consumers]
        if channel.public:
            sources.append("caller")
        tensor = channels.get(name)
        if channel.dtype == "int":
            norm = "int: no gradient"
        elif tensor is None or tensor.grad is None:
            norm = "none reached it"
        else:
            norm = _fmt(tensor.grad.double().norm().item())
        table.add_row(Text(printable(name)), Text(producer), Text(", ".join(sources) or "(nothing)"), norm)
    return table


def parameter_grad_norm(model: torch.nn.Module) -> float:
    norms = [p.grad.double().norm() for p in model.parameters() if p.grad is not None]
    return torch.stack(norms).norm().item() if norms else 0.0


@contextlib.contextmanager
def _progress(console: Console) -> Iterator[Progress]:
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        yield progress


def main(analysis: Analysis, console: Console) -> int:
    session = start(analysis, console)
    run: RunSettings = session.section("run")
    with session.parallel("run", ("run.tokens", run.tokens), run.seq_len) as par:
        return _run(session, run.steps, run.tokens, console, par, run.seq_len)


def _run(
    session: Session, steps: int, tokens: int, console: Console, par: ParallelContext, seq_len: int
) -> int:
    plan, engine, kernels = session.plan, session.engine, session.kernels
    device, dtype, seed, recipe = par.device(session.device), session.dtype, session.seed, session.recipe
    header = (
        f"{printable(plan.name)}: device {device}, dtype {str(dtype).removeprefix('torch.')}, seed {seed}"
    )
    if engine == "te":
        header += f", kernels {kernels}, recipe {printable(recipe.name)}"
    elif recipe.kind != "none":
        header += f"; recipe {printable(recipe.name)} ignored by the reference engine"
    console.print(header, markup=False)
    if par.is_parallel:
        console.print(f"parallel: {par.settings.describe()}; tables show rank 0", markup=False)
    # Before anything is allocated: sizes that cannot fit are refused with the estimate.
    fused = fused_attention(engine, kernels, device, dtype)
    needed = estimate(plan, dtype, tokens=tokens, trained=1, seq_len=seq_len, fused_attention=fused)
    check_fits(needed, device, f"running {plan.name}", "lower run.tokens or make the model smaller")
    # Build before printing the plan, so an engine that cannot run here says so first.
    torch.manual_seed(seed)
    model = build(
        plan,
        engine=engine,
        kernels=kernels,
        device=device,
        dtype=dtype,
        recipe=session.engine_recipe,
        parallel=par,
    )
    for table in plan_tables(plan):
        console.print(table)
    record = getattr(model, "record_channels", None)
    if record is not None:
        record(True)
    with _progress(console) as progress:
        results = run_steps(
            model,
            plan,
            steps=steps,
            tokens=tokens,
            seed=seed,
            device=device,
            dtype=dtype,
            progress=progress,
            parallel=par,
            seq_len=seq_len,
        )

    last = results[-1]
    console.print(output_table(last))
    if plan.channels:
        if record is not None:
            console.print(channel_grad_table(plan, getattr(model, "channel_tensors", {})))
        else:
            console.print(f"per-channel gradients are recorded by the reference engine only ({model.engine})")
    grad_norm = par.grad_norm(model) if par.is_parallel else parameter_grad_norm(model)
    console.print(
        f"engine {model.engine}: loss {last.loss:.6g}, parameter-gradient norm "
        f"{grad_norm:.6g}, step time {median_step_time(results) * 1e3:.2f} ms "
        f"({step_time_note(len(results))})",
        markup=False,
    )
    return 0
