"""``graph``: draw the channel graph. A config with errors still draws, with the problems in red, and
then exits 2 after printing every diagnostic."""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import OmegaConf
from rich.console import Console

from te_assembly.cli.commands.common import load_and_validate
from te_assembly.cli.report import print_diagnostics
from te_assembly.graph import FORMATS, render, view_from_model, view_from_plan


def main(overrides: Sequence[str], console: Console) -> int:
    loaded, diags, plan = load_and_validate(overrides)
    settings = OmegaConf.to_container(loaded.cfg.get("graph") or {}, resolve=True)
    assert isinstance(settings, dict)
    out_dir = str(settings.get("out_dir") or "graph_out")
    formats = list(settings.get("formats") or FORMATS)
    if plan is not None:
        view = view_from_plan(plan)
        view.diagnostics = diags
    else:
        view = view_from_model(loaded.model, diags)
    result = render(view, out_dir, formats)
    text = result.written.get("mermaid")
    console.print(text.read_text() if text is not None else "", markup=False, end="", soft_wrap=True)
    err = Console(stderr=True, highlight=False)
    for fmt, path in result.written.items():
        err.print(f"wrote {fmt}: {path}", markup=False)
    for fmt, why in result.skipped.items():
        err.print(f"skipped {fmt}: {why}", style="yellow", markup=False)
    if diags:
        print_diagnostics(diags, err)
    if plan is None:
        err.print("the graph marks the problems in red", style="bold red", markup=False)
        return 2
    return 0
