"""Hydra's composition errors, in te_assembly's words: one short message, what exists, a suggestion.

Hydra appends its search path to "not found" errors and a link to its docs to parse errors: noise for a
user picking a model. A YAML syntax error in a config file Hydra reads (a user's primary config) becomes
a located diagnostic like any other.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import yaml

from te_assembly.config.locations import FILE_GROUPS, is_path_choice
from te_assembly.diagnostics import Diagnostic, did_you_mean, error
from te_assembly.files.file_types import not_regular

_CANNOT_OVERRIDE = re.compile(r"Could not override '([^']+)'")


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def syntax_error_in(exc: BaseException) -> Diagnostic | None:
    """A YAML syntax error behind ``exc`` (in a config file Hydra read), as a located diagnostic."""
    for item in _chain(exc):
        if isinstance(item, yaml.MarkedYAMLError):
            mark = item.problem_mark or item.context_mark
            problem = item.problem or str(item).strip().splitlines()[0]
            diag = error("config", "yaml-syntax", f"YAML syntax error: {problem}")
            if mark is not None:
                return diag.located(mark.name, mark.line + 1)
            return diag
    return None


def from_composition(exc: BaseException) -> bool:
    """True when ``exc`` is an error Hydra or OmegaConf raised about the config (some are plain
    ``ValueError``s), not a bug elsewhere: its innermost frame is in one of those packages."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(exc, (HydraException, OmegaConfBaseException, yaml.YAMLError)):
        return True
    if not isinstance(exc, (ValueError, TypeError, KeyError, AssertionError)):
        return False
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    return last is not None and any(f"{os.sep}{pkg}{os.sep}" in last for pkg in ("hydra", "omegaconf"))


def unknown_choice(group: str, choice: str, available: Sequence[str]) -> str:
    if is_path_choice(choice):
        kind = not_regular(choice)
        if kind is not None:
            return f"{group} file {choice} is {kind}, not a {group} file"
        return f"{group} file not found: {choice} (relative paths start at {os.getcwd()})"
    hint = did_you_mean(choice, available)
    return (
        f"unknown {group} {choice!r}"
        + (f" ({hint})" if hint else "")
        + f"\navailable {group}s: {', '.join(available) or 'none'}"
    )


def describe(exc: BaseException, overrides: Sequence[str]) -> str:
    """The one message for a Hydra or OmegaConf composition error."""
    from hydra.errors import MissingConfigException

    text = str(exc).strip().split("\nConfig search path:")[0].rstrip()
    text = "\n".join(line for line in text.splitlines() if "hydra.cc" not in line).strip()
    if isinstance(exc, MissingConfigException) and exc.missing_cfg_file:
        group, _, choice = exc.missing_cfg_file.partition("/")
        if choice and (group in FILE_GROUPS or exc.options is not None):
            return unknown_choice(group, choice, sorted(exc.options or []))
    missing = _CANNOT_OVERRIDE.search(text)
    if missing is not None:
        hint = _override_hint(missing.group(1), overrides)
        if hint:
            text += f"\n{hint}"
    return text or type(exc).__name__


def _override_hint(key: str, overrides: Sequence[str]) -> str | None:
    """Did-you-mean for an override of a key that does not exist: compose again without it (only on
    this error path) and look for close keys where it should have been."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from hydra.types import RunMode
    from omegaconf.errors import OmegaConfBaseException

    from te_assembly.config.composition import CONFIG_NAME
    from te_assembly.config.interpolate import suggest_key

    if not GlobalHydra.instance().is_initialized():
        return None
    rest = [o for o in overrides if o.partition("=")[0].lstrip("+~") != key]
    loader = GlobalHydra.instance().config_loader()
    try:
        cfg = loader.load_configuration(CONFIG_NAME, rest, RunMode.RUN)
    except (HydraException, OmegaConfBaseException, yaml.YAMLError):
        return None
    return suggest_key(cfg, key)


__all__ = ["describe", "from_composition", "syntax_error_in", "unknown_choice"]
