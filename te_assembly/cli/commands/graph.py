"""``graph``: draw the channel graph. A config with errors still draws, with the problems in red, and
then exits 2 after printing every diagnostic."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig
from rich.console import Console

from te_assembly.cli.commands.common import load_and_validate, setting
from te_assembly.cli.report import print_diagnostics
from te_assembly.diagnostics import Diagnostic, did_you_mean, error
from te_assembly.errors import ConfigError
from te_assembly.graph import FORMATS, render, view_from_model, view_from_plan

KEYS = ("out_dir", "formats")


def graph_settings(cfg: DictConfig) -> tuple[str, list[str]]:
    """``graph.out_dir`` and ``graph.formats``, checked; every problem is one ``ConfigError``.

    ``formats`` is a list of format names or a single name (``graph.formats=svg``); empty means all."""
    node = setting(cfg, "graph")
    keys = [str(k) for k in node.keys()] if isinstance(node, DictConfig) else []
    diags: list[Diagnostic] = [
        error(f"graph.{k}", "unknown-key", f"unknown graph setting {k!r}", did_you_mean(k, KEYS))
        for k in keys
        if k not in KEYS
    ]
    out_dir = setting(cfg, "graph.out_dir")
    if out_dir is None:
        out_dir = "graph_out"
    elif isinstance(out_dir, bool) or not isinstance(out_dir, str | int) or not str(out_dir):
        message = f"out_dir must be a directory path, got {out_dir!r}"
        diags.append(error("graph.out_dir", "bad-graph-value", message))
    formats, problems = _formats(setting(cfg, "graph.formats"))
    diags += problems
    if diags:
        raise ConfigError(diags)
    return str(out_dir), formats


def _formats(raw: Any) -> tuple[list[str], list[Diagnostic]]:
    if raw is None:
        return list(FORMATS), []
    # A single name is one format, not a sequence of one-letter formats.
    items = [raw] if isinstance(raw, str) else list(raw) if isinstance(raw, Sequence) else [raw]
    if not items:
        return list(FORMATS), []
    choices = ", ".join(FORMATS)
    diags = []
    for i, item in enumerate(items):
        if item not in FORMATS:
            listed = isinstance(raw, Sequence) and not isinstance(raw, str)
            path = f"graph.formats[{i}]" if listed else "graph.formats"
            message = f"unknown graph format {item!r}; choose from {choices}"
            diags.append(error(path, "bad-graph-format", message, did_you_mean(item, FORMATS)))
    return list(dict.fromkeys(str(f) for f in items)), diags


def main(overrides: Sequence[str], console: Console) -> int:
    loaded, diags, plan = load_and_validate(overrides)
    out_dir, formats = graph_settings(loaded.cfg)
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
