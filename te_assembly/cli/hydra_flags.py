"""Hydra's own flags, te_assembly's way: ``--cfg`` (with ``--package`` and ``--resolve``) shows the model,
the recipe and the blocks as te_assembly reads them; ``--shell-completion`` completes the installed
``te-assembly`` command, config folders named with ``-cd`` included."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from io import StringIO
from typing import Any

import yaml


def show_cfg(
    hydra: Any,
    config_name: str,
    overrides: list[str],
    args: argparse.Namespace,
    config_dirs: Sequence[str],
    io: Any,
) -> int:
    """Hydra's ``--cfg job|hydra|all`` (with ``--package`` and ``--resolve``), showing the model and the
    recipe as te_assembly reads them (file, merged configs, overrides, interpolations) instead of stubs."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from te_assembly.analysis.pipeline import task_overrides
    from te_assembly.cli.report import print_diagnostics
    from te_assembly.config.locations import FILE_GROUPS
    from te_assembly.config.resolved import resolve_composed

    cfg = hydra.compose_config(config_name, overrides, run_mode=RunMode.RUN, with_log_configuration=False)
    HydraConfig.instance().set_config(cfg)
    resolved = resolve_composed(cfg, task_overrides(cfg), config_dirs)
    # The model and recipe are shown as read; with --resolve, every value as the commands see it.
    load_errors = [
        d
        for d in resolved.diagnostics
        if d.is_error and (args.resolve or d.path.split(".")[0].split("[")[0] in FILE_GROUPS)
    ]
    if load_errors:
        print_diagnostics(load_errors, io.err)
        return 2
    full = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(full, dict)
    if args.resolve:
        full.update(resolved.settings)
        if args.cfg != "job":
            full["hydra"] = _resolved_hydra(cfg)
    for group in FILE_GROUPS:
        if group in full:
            full[group] = getattr(resolved, group)
    if resolved.expansion is not None and resolved.expansion.blocks:
        # The blocks the model uses, as read (block.* overrides applied): -p block.moe_layer shows one.
        full["block"] = dict(resolved.expansion.blocks)
    if args.cfg == "job":
        full.pop("hydra", None)
    elif args.cfg == "hydra":
        hydra_part = full.get("hydra", {})
        for key in ("help", "hydra_help"):
            hydra_part.pop(key, None)
        full = {"hydra": hydra_part}
    shown: Any = full
    if args.package and args.package != "_global_":
        shown = full
        for key in args.package.split("."):
            if not isinstance(shown, dict) or key not in shown:
                io.err.print(f"error: package {args.package!r} not found in config", markup=False)
                return 2
            shown = shown[key]
        print(f"# @package {args.package}")
    if isinstance(shown, (dict, list)):
        sys.stdout.write(yaml.safe_dump(shown, sort_keys=False, allow_unicode=True, default_flow_style=False))
    else:
        print(shown)
    return 0


def completion_config_dirs(line: str) -> tuple[str, ...]:
    """A ``-cd DIR`` on the line being completed, so its models and recipes complete too."""
    words = line.split()
    for flag in ("-cd", "--config-dir"):
        if flag in words[:-1]:
            return (words[words.index(flag) + 1],)
    return ()


def _resolved_hydra(cfg: Any) -> Any:
    """Hydra's node resolved where it can be: the overrides it records (and names made from them) hold
    the command line's text, which may itself look like an interpolation."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_container(cfg.hydra, resolve=True)
    except OmegaConfBaseException:
        return OmegaConf.to_container(cfg.hydra, resolve=False)


def shell_completion(hydra: Any, config_name: str, overrides: list[str], commands: Sequence[str]) -> int:
    """Hydra's shell completion for the installed ``te-assembly`` command (Hydra's scripts complete an
    executable or a ``python script.py``, not ``python -m``); a command word on the line is skipped."""
    from hydra.plugins.completion_plugin import CompletionPlugin

    line = os.environ.get("COMP_LINE")
    if line is not None:
        stripped = CompletionPlugin.strip_python_or_app_name(line)
        words = stripped.split(" ")
        if words and words[0] in commands:
            stripped = " ".join(words[1:])
        os.environ["COMP_LINE"] = f"te-assembly {stripped}"
    saved = sys.argv[0]
    sys.argv[0] = "te-assembly"  # the script Hydra prints completes this executable
    printed = StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            hydra.shell_completion(config_name=config_name, overrides=overrides)
    finally:
        sys.argv[0] = saved
    text = printed.getvalue()
    if line is not None:
        # configs/block is a folder of blocks a model's steps use, not a group the command line chooses.
        kept = [w for w in text.rstrip("\n").split(" ") if not w.startswith("block=")]
        text = " ".join(kept) + ("\n" if text.endswith("\n") else "")
    sys.stdout.write(text)
    return 0


__all__ = ["completion_config_dirs", "shell_completion", "show_cfg"]
