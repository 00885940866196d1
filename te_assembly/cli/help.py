"""``COMMAND --help``: the command's settings, each with its current value and one line of doc, the
config groups with every option (the user's folders included), Hydra's flags and the other commands.

Keys and docs come from the settings dataclasses (``sections.setting``), the values from the composed
config, so ``train --help train.lr=0.1 -cd DIR`` shows what that command line would run with.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from te_assembly.cli.app import COMMANDS, PROG, Consoles
from te_assembly.diagnostics import printable
from te_assembly.sections import section_help


def _composed(
    command: str, hydra_args: Sequence[str]
) -> tuple[dict[str, Any], dict[str, list[str]], str | None]:
    """Settings values, group options and Hydra's flag help for this command line (or empty where it
    does not compose: help still prints)."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import get_args_parser
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from te_assembly.analysis.pipeline import task_overrides
    from te_assembly.config.composition import CONFIG_NAME, create_hydra
    from te_assembly.config.locations import FILE_GROUPS
    from te_assembly.config.resolved import resolve_composed

    parser = get_args_parser()
    saved, sys.argv[0] = sys.argv[0], "te-assembly"  # Hydra's completion help names the executable
    try:
        flags = Hydra.format_args_help(parser)
    finally:
        sys.argv[0] = saved
    try:
        args, _ = parser.parse_known_args(list(hydra_args))
        dirs = (args.config_dir,) if args.config_dir else ()
        hydra = create_hydra(command, dirs, args.config_path)
        try:
            cfg = hydra.compose_config(
                args.config_name or CONFIG_NAME, list(args.overrides), run_mode=RunMode.RUN
            )
            groups = {g: hydra.config_loader.get_group_options(g) for g in FILE_GROUPS}
            resolved = resolve_composed(cfg, task_overrides(cfg), dirs)
            values = dict(resolved.settings)
            choices = {g: v for g, v in resolved.choices.items() if v}
            values.update({f"_{g}": v for g, v in choices.items()})
            return values, groups, flags
        finally:
            GlobalHydra.instance().clear()
    except Exception:  # help never fails: without a composition it shows the declared defaults
        return {}, {}, flags


def print_help(command: str | None, hydra_args: Sequence[str], io: Consoles, general: str) -> int:
    out = io.out
    if command is None:
        out.print(general, markup=False)
        return 0
    module = importlib.import_module(COMMANDS[command][0])
    values, groups, flags = _composed(command, hydra_args)
    out.print(f"usage: {PROG} {command} [HYDRA FLAGS] [KEY=VALUE ...]\n", markup=False)
    out.print(f"{command}: {COMMANDS[command][1]}", markup=False)
    doc = (module.__doc__ or "").strip().replace("``", "`")
    if doc:
        out.print(Text(doc))
    table = Table(title="settings (KEY=VALUE on the command line)", title_justify="left", box=None)
    table.add_column("key", no_wrap=True)
    table.add_column("value", max_width=16)  # a long list wraps in its own cell, not the docs beside it
    table.add_column("what it does")
    for name, cls in module.SECTIONS.items():
        current = values if name == "" else values.get(name)
        for key, value, line in section_help(cls, current if isinstance(current, dict) else None, name):
            table.add_row(Text(key), Text(printable(value)), Text(line))
    out.print(table)
    out.print(
        "config groups (GROUP=NAME, or GROUP=path/to/file.yaml; -cd DIR adds DIR/GROUP/*.yaml):", markup=False
    )
    from te_assembly.config.locations import available_models, available_recipes

    options = groups or {"model": available_models(), "recipe": available_recipes()}
    for group, names in options.items():
        if group == "block":  # no choice of its own: a model's steps use blocks
            continue
        chosen = values.get(f"_{group}")
        now = f" (now: {printable(str(chosen))})" if chosen else ""
        out.print(Text(f"  {group}: {', '.join(names)}{now}"))
    blocks = options.get("block")
    if blocks:
        where = "for a model's steps (block: NAME; -cd DIR adds DIR/block/*.yaml)"
        out.print(Text(f"blocks, {where}: {', '.join(blocks)}"))
    if flags:
        out.print("\nHydra flags:", markup=False)
        for line in flags.splitlines():
            out.print(Text(f"  {line}"))
    out.print("\ncommands:", markup=False)
    for name, (_, text) in COMMANDS.items():
        out.print(f"  {name:<9} {text}", markup=False)
    return 0


__all__ = ["print_help"]
