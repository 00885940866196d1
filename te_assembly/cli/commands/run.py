"""``run`` (the default command): the ``run`` job (``jobs/run.py``) with a progress bar, then its result
as tables: output statistics, the gradient reaching each channel's producer, the step time."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from te_assembly.analysis.analyze import DEFAULT_SECTIONS, Analysis
from te_assembly.analysis.plan import Plan
from te_assembly.analysis.settings import RunSettings
from te_assembly.cli.commands.session import Session, progress_bar, start
from te_assembly.diagnostics import printable
from te_assembly.engines.target import Target
from te_assembly.jobs.events import Built
from te_assembly.jobs.run import ChannelGrad, OutputStats, RunResult, run, step_time_note
from te_assembly.views.explain import plan_tables

SECTIONS = DEFAULT_SECTIONS


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def output_table(rows: Sequence[OutputStats]) -> Table:
    table = Table(title="outputs (last step)", title_justify="left")
    for col in ("output", "shape", "dtype", "mean", "std", "absmax"):
        table.add_column(col, justify="right" if col in ("mean", "std", "absmax") else "left")
    for r in rows:
        table.add_row(
            Text(printable(r.name)), str(r.shape), r.dtype, _fmt(r.mean), _fmt(r.std), _fmt(r.absmax)
        )
    return table


def channel_grad_table(rows: Sequence[ChannelGrad]) -> Table:
    """d loss / d channel, summed over all its consumers (and the caller, for a public channel)."""
    table = Table(title="gradient reaching each channel's producer (last step)", title_justify="left")
    for col in ("channel", "producer", "summed over", "grad norm"):
        table.add_column(col, justify="right" if col == "grad norm" else "left")
    for r in rows:
        sources = Text(printable(", ".join(r.summed_over) or "(nothing)"))
        norm = r.why if r.norm is None else f"{r.norm:.4g}"
        table.add_row(Text(printable(r.name)), Text(printable(r.producer)), sources, norm)
    return table


def main(analysis: Analysis, console: Console) -> int:
    session = start(analysis, console)
    settings: RunSettings = session.section("run")
    with session.distributed("run", ("run.tokens", settings.tokens), settings.seq_len) as target:
        _header(session, target, console)
        with progress_bar(console) as progress:

            def on_event(event: object) -> None:
                if isinstance(event, Built):  # the plan only once the engine is known to run here
                    for table in plan_tables(session.plan):
                        console.print(table)
                progress.on_event(event)

            result = run(session.plan, target, settings, on_event=on_event)
        _report(session, result, console)
    return 0


def _header(session: Session, target: Target, console: Console) -> None:
    recipe = target.recipe
    header = f"{printable(session.plan.name)}: device {target.device}, dtype {target.dtype_name}"
    header += f", seed {target.seed}"
    if target.engine == "te":
        # A recipe of kind none (the shipped bf16) quantizes nothing: say so, not "recipe bf16" on float32.
        quantized = recipe.kind != "none"
        quantization = f"recipe {printable(recipe.name)}" if quantized else "no quantization recipe"
        header += f", kernels {target.kernels}, {quantization}"
    elif recipe.kind != "none":
        header += f"; recipe {printable(recipe.name)} ignored by the reference engine"
    console.print(header, markup=False)
    if target.is_parallel:
        assert target.parallel is not None
        console.print(f"parallel: {target.parallel.settings.describe()}; tables show rank 0", markup=False)


NORMS = ("RMSNorm", "LayerNorm")


def _normalised_output_note(plan: Plan) -> str | None:
    """Why the gradients upstream of a final norm look vanishing under ``mean(y^2)``: a normalised
    ``y``'s mean square is nearly constant whatever its input, so those gradients are tiny by design."""
    if plan.takes_token_ids or not plan.steps or plan.steps[-1].type not in NORMS:
        return None
    return (
        f"note: y comes out of the {plan.steps[-1].type} step {plan.steps[-1].name}, whose output's mean "
        "square "
        "barely depends on its input, so the objective mean(y^2) sends back almost no gradient: the small "
        "norms above that step are expected, not broken gradient flow (train and verify use other objectives)"
    )


def _report(session: Session, result: RunResult, console: Console) -> None:
    console.print(output_table(result.outputs))
    if session.plan.channels:
        if result.channel_grads is not None:
            console.print(channel_grad_table(result.channel_grads))
            note = _normalised_output_note(session.plan)
            if note:
                console.print(note, markup=False, soft_wrap=True)
        elif not result.notes:
            console.print(
                f"per-channel gradients are recorded by the reference engine only ({result.engine})"
            )
    for note in result.notes:
        console.print(f"note: {note}", markup=False, soft_wrap=True)
    console.print(
        f"engine {result.engine}: loss {result.loss:.6g}, parameter-gradient norm "
        f"{result.grad_norm:.6g}, step time {result.step_seconds * 1e3:.2f} ms "
        f"({step_time_note(len(result.steps))})",
        markup=False,
    )
