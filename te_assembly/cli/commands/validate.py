"""``validate``: exit 0 with a summary, or 2 with every diagnostic."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console

from te_assembly.cli.commands.common import load_and_validate, section
from te_assembly.errors import ConfigError


def main(overrides: Sequence[str], console: Console) -> int:
    loaded, diags, plan = load_and_validate(overrides)
    if plan is None:
        raise ConfigError(diags)
    from te_assembly.cli.report import print_diagnostics

    print_diagnostics(diags, console)
    where = f" ({loaded.file})" if loaded.file else ""
    console.print(
        f"{plan.name}{where}: valid — {len(plan.steps)} steps, {len(plan.fusers)} fuser(s), "
        f"{len(plan.channels)} channel(s), {len(plan.public_inputs)} public input(s), "
        f"{len(plan.public_outputs)} public output(s), {len(diags)} warning(s)",
        markup=False,
    )
    layout = _layout_line(section(loaded.cfg, "parallel"))
    if layout:
        console.print(layout, markup=False)
    return 0


def _layout_line(raw: dict[str, Any]) -> str | None:
    from te_assembly.parallel.checks import read_settings
    from te_assembly.parallel.launch import torchrun_command

    settings, _ = read_settings(raw)
    if settings is None or not settings.is_parallel:
        return None
    return f"parallel: {settings.describe()}; launch {torchrun_command(settings.world_size)}"
