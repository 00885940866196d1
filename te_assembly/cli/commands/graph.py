"""``graph``: draw the channel graph into the run directory (``outputs/<model>/<date>_<time>/``, or
``graph.out_dir``), files named after the model chosen (``model=moe_block`` -> ``moe_block.mmd``; a model
file by its stem), with the resolved config beside them (``config.yaml``). A config with errors still
draws, with the problems in red, and then exits 2 after printing every diagnostic. Block steps are drawn
collapsed, one node per run of identical uses, unless ``graph.expand`` names them (``all``, ``layers``,
``layers.3``)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from te_assembly.analysis.analyze import COMMON_SECTIONS, Analysis
from te_assembly.cli import job_dir
from te_assembly.cli.report import print_diagnostics
from te_assembly.diagnostics import printable
from te_assembly.errors import ConfigError
from te_assembly.files.ownership import check_not_a_run, check_not_theirs
from te_assembly.views.graph import GraphSettings, render, view_from_analysis
from te_assembly.views.outline import parse_expand

SECTIONS = {**COMMON_SECTIONS, "graph": GraphSettings}
RUN_DIR = True


def main(analysis: Analysis, console: Console) -> int:
    if "graph" not in analysis.sections:  # where and what to write must be right before drawing
        raise ConfigError(list(analysis.diagnostics))
    settings: GraphSettings = analysis.section("graph")
    expand, problems = parse_expand(settings.expand, analysis.blocks, "graph.expand")
    if problems:  # before anything is written: the user asked for a drawing this model cannot give
        raise ConfigError([*analysis.diagnostics, *problems])
    job = job_dir.current("graph")
    if settings.out_dir is not None:
        check_not_a_run(Path(str(settings.out_dir)), "graph")
        check_not_theirs(Path(str(settings.out_dir)) / job_dir.CONFIG_FILE, "graph")
    out = Path(str(settings.out_dir)) if settings.out_dir is not None else job_dir.claim(job)
    result = render(view_from_analysis(analysis, expand), out, settings.chosen_formats, stem=job.model)
    config = job_dir.write_config(out, analysis.resolved.as_config(), job)
    text = result.written.get("mermaid")
    shown = printable(text.read_text(), keep_newlines=True) if text is not None else ""
    console.print(shown, markup=False, end="", soft_wrap=True)
    err = Console(stderr=True, highlight=False)
    for fmt, path in result.written.items():
        err.print(f"wrote {fmt}: {printable(str(path))}", markup=False)
    err.print(f"wrote the resolved config: {printable(str(config))}", markup=False)
    for fmt, why in result.skipped.items():
        err.print(f"skipped {fmt}: {why}", style="yellow", markup=False)
    if analysis.diagnostics:
        print_diagnostics(analysis.diagnostics, err)
    if analysis.plan is None:
        err.print("the graph marks the problems in red", style="bold red", markup=False)
        return 2
    return 0
