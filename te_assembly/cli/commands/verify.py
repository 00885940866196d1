"""``verify``: the TE engine against the reference engine, tensor by tensor; exit 1 on any mismatch.

Kernels: ``kernels=...`` when given; otherwise TE's own kernels on a GPU and, without one, the
reference math inside TE's real fusers (``kernels=reference``), which checks TE's channel routing,
locking and gradient accumulation against the reference engine on any machine.

Both models run in eval mode: dropout masks come from each implementation's own RNG and are not
comparable, so dropout is the identity for the comparison.

Writes the comparison as ``verify.json`` and the resolved config as ``config.yaml`` into the run
directory (``outputs/<model>/<date>_<time>/``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from te_assembly.analysis.analyze import COMMON, DEFAULT_SECTIONS, Analysis
from te_assembly.analysis.settings import CommonSettings, RunSettings
from te_assembly.cli import job_dir
from te_assembly.cli.commands.common import checked_plan
from te_assembly.cli.commands.import_hf import ImportSettings
from te_assembly.diagnostics import printable
from te_assembly.engines import te_available
from te_assembly.engines.target import Target
from te_assembly.errors import EngineUnavailableError
from te_assembly.jobs.verify import VerifyReport, verify

if TYPE_CHECKING:
    from te_assembly.jobs.verify_hf import HFReport
from te_assembly.files.write import write_text_atomic

SECTIONS = {**DEFAULT_SECTIONS, "import_hf": ImportSettings}
"""``import_hf.ignore_fields`` applies to ``verify hf=DIR`` as to its import."""
RUN_DIR = True

INSTALL_HINT = (
    "verify needs Transformer Engine: pip install 'te_assembly[te]' "
    "(on a machine without a GPU: scripts/install_te_cpu.sh)"
)


def _kernels(overrides: Sequence[str], configured: str, on_gpu: bool) -> str:
    """``kernels`` when the command line sets it; otherwise TE's on a GPU, the reference math without."""
    if any(o.lstrip("+").startswith("kernels=") for o in overrides):
        return configured
    return "te" if on_gpu else "reference"


def _fmt(value: float) -> str:
    return f"{value:.3e}"


def report_table(report: VerifyReport) -> Table:
    tol = report.tolerance
    table = Table(
        title=f"{printable(report.model)}: engine=te kernels={report.kernels} vs reference, "
        "both in eval mode "
        f"({report.device}, {report.dtype}, recipe {report.recipe or 'none'}; precision {report.precision}, "
        f"pass: max abs <= {tol.atol:g} + {tol.rtol:g} * max|ref|, int tensors exact)",
        title_justify="left",
    )
    for col in ("tensor", "kind", "shape", "max abs err", "max rel err", "result"):
        table.add_column(col, justify="right" if "err" in col else "left")
    for c in report.comparisons:
        result = "[green]pass[/green]" if c.passed else "[bold red]FAIL[/bold red]"
        if c.note:
            result += f" ({c.note})"
        if c.exact:
            result += " (exact)"
        table.add_row(Text(printable(c.name)), c.kind, str(c.shape), _fmt(c.max_abs), _fmt(c.max_rel), result)
    return table


def main(analysis: Analysis, console: Console) -> int:
    common: CommonSettings = analysis.section(COMMON)
    run: RunSettings = analysis.section("run")
    if common.hf is not None:
        return _verify_hf(analysis, common, run, console)
    plan = checked_plan(analysis, console)
    if not te_available():
        raise EngineUnavailableError(INSTALL_HINT)
    job_dir.check_claimable(job_dir.current("verify"))  # where it writes, before both models are built
    target = Target.from_settings(common, analysis.recipe)
    kernels = _kernels(analysis.resolved.overrides, common.kernels, target.device.type == "cuda")
    report = verify(plan, dataclasses.replace(target, kernels=kernels), run)
    console.print(report_table(report))
    job = job_dir.current("verify")
    out = job_dir.claim(job)
    job_dir.write_config(out, analysis.resolved.as_config(), job)
    written = write_text_atomic(out / "verify.json", json.dumps(report_json(report), indent=1))
    console.print(f"wrote {printable(str(written))}", markup=False, soft_wrap=True)
    failures = report.failures
    if failures:
        names = printable(", ".join(c.name for c in failures))
        console.print(
            f"verify FAILED: {len(failures)} of {len(report.comparisons)} tensors differ: {names}",
            style="bold red",
            markup=False,
        )
        return 1
    console.print(f"verify passed: {len(report.comparisons)} tensors match", style="green", markup=False)
    return 0


def report_json(report: VerifyReport) -> dict[str, Any]:
    """The report as JSON data: the setting, the tolerance, every tensor's comparison, the verdict."""
    data = dataclasses.asdict(report)
    data["passed"] = report.passed
    return data


def _verify_hf(analysis: Analysis, common: CommonSettings, run: RunSettings, console: Console) -> int:
    from te_assembly.jobs.verify_hf import verify_hf

    assert common.hf is not None
    job_dir.check_claimable(job_dir.current("verify"))
    importing: ImportSettings = analysis.section("import_hf")
    report = verify_hf(
        common.hf, Target.from_settings(common, None), run, ignore_fields=importing.ignore_fields
    )
    console.print(hf_table(report))
    for note in report.notes:
        console.print(f"note: {note}", markup=False, soft_wrap=True)
    job = job_dir.current("verify")
    out = job_dir.claim(job)
    job_dir.write_config(out, analysis.resolved.as_config(), job)
    written = write_text_atomic(out / "verify.json", json.dumps(report.json(), indent=1))
    console.print(f"wrote {printable(str(written))}", markup=False, soft_wrap=True)
    result = report.comparison
    if not report.passed:
        worst, diff = result.worst()
        console.print(
            f"verify FAILED: {printable(worst)} differs from transformers' by {diff:.3e} "
            f"({result.relative(worst):.3e} of its largest value)",
            style="bold red",
            markup=False,
        )
        return 1
    console.print(
        f"verify passed: logits, loss and {len(result.differences) - 2} gradients match transformers'",
        style="green",
        markup=False,
    )
    return 0


def hf_table(report: HFReport) -> Table:
    tolerance, result = report.tolerance, report.comparison
    table = Table(
        title=f"{printable(report.architecture)} from {printable(report.source)}: te_assembly "
        f"(engine={report.engine}) vs transformers, {report.dtype}, 2 x {report.seq_len} token ids "
        f"(pass: max abs <= {tolerance:g} * max|transformers|)",
        title_justify="left",
    )
    for col in ("tensor", "max abs diff", "max |transformers|", "result"):
        table.add_column(col, justify="right" if "max" in col else "left")
    for name in result.differences:
        ok = result.relative(name) <= tolerance
        table.add_row(
            Text(printable(name)),
            _fmt(result.differences[name]),
            _fmt(result.scales[name]),
            "[green]pass[/green]" if ok else "[bold red]FAIL[/bold red]",
        )
    return table
