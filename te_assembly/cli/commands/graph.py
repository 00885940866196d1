"""``graph``: draw the channel graph. A config with errors still draws, with the problems in red, and
then exits 2 after printing every diagnostic. Block steps are drawn collapsed, one node per run of
identical uses, unless ``graph.expand`` names them (``all``, ``layers``, ``layers.3``)."""

from __future__ import annotations

from rich.console import Console

from te_assembly.cli.report import print_diagnostics
from te_assembly.diagnostics import printable
from te_assembly.errors import ConfigError
from te_assembly.graph import GraphSettings, render, view_from_analysis
from te_assembly.outline import parse_expand
from te_assembly.validate.analysis import COMMON_SECTIONS, Analysis

SECTIONS = {**COMMON_SECTIONS, "graph": GraphSettings}


def main(analysis: Analysis, console: Console) -> int:
    if "graph" not in analysis.sections:  # where and what to write must be right before drawing
        raise ConfigError(list(analysis.diagnostics))
    settings: GraphSettings = analysis.section("graph")
    expand, problems = parse_expand(settings.expand, analysis.blocks, "graph.expand")
    if problems:  # before anything is written: the user asked for a drawing this model cannot give
        raise ConfigError([*analysis.diagnostics, *problems])
    result = render(view_from_analysis(analysis, expand), settings.directory, settings.chosen_formats)
    text = result.written.get("mermaid")
    shown = printable(text.read_text(), keep_newlines=True) if text is not None else ""
    console.print(shown, markup=False, end="", soft_wrap=True)
    err = Console(stderr=True, highlight=False)
    for fmt, path in result.written.items():
        err.print(f"wrote {fmt}: {printable(str(path))}", markup=False)
    for fmt, why in result.skipped.items():
        err.print(f"skipped {fmt}: {why}", style="yellow", markup=False)
    if analysis.diagnostics:
        print_diagnostics(analysis.diagnostics, err)
    if analysis.plan is None:
        err.print("the graph marks the problems in red", style="bold red", markup=False)
        return 2
    return 0
