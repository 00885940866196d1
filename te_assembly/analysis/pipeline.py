"""One config, from YAML to a validated plan: the pipeline every command and ``build()`` go through.

    source (config/source.py)      each file read and parsed once, with its line map; limits
      -> resolved (config/resolved.py)   plain data for model, recipe and settings; overrides and
                                          interpolations applied once; load diagnostics
      -> analysis (validate/analysis.py)  frozen steps, fusers, channel graph; every diagnostic
                                          located, sorted and deduplicated once
      -> plan                              when nothing is an error

Hydra composes the settings and picks the model and recipe files (``config/composition.py``); the CLI
drives the same passes per job (``cli/app.py``). Pure Python: no torch, no TE.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from te_assembly.analysis.analyze import Analysis, analyze_resolved
from te_assembly.collector import paused
from te_assembly.errors import ArgumentError, CompositionError, ConfigError

_PLAIN_CHOICE = re.compile(r"[\w./\\:+-]+")


def quoted_value(value: str) -> str:
    """A name or path as a Hydra override value (quoted when it holds grammar characters)."""
    if _PLAIN_CHOICE.fullmatch(value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def load(
    config: str | os.PathLike[str] | Mapping[str, Any] | Analysis | None = None,
    overrides: Sequence[str] = (),
    *,
    config_dirs: Sequence[str | os.PathLike[str]] = (),
    sections: Mapping[str, type] | None = None,
) -> Analysis:
    """Load and check a config; ``.plan`` is the plan when nothing is an error, ``.diagnostics`` lists
    every finding (``.checked_plan()`` raises ``ConfigError`` with them instead).

    ``config``: a model name (shipped, or in one of ``config_dirs``, folders laid out like ``configs/``:
    ``model/*.yaml``, ``recipe/*.yaml``), a path to a model file, a model mapping (what a model file
    holds, or a whole config with a ``model`` key), or None for the default model. ``overrides`` are
    Hydra overrides (``model.dims.hidden=128``, ``recipe=mxfp8``, ``seed=3``); with a mapping, only
    ``model.*`` and ``recipe.*`` ones. Raises ``ArgumentError`` (a ``TypeError``) for a config of another
    type, a blank name or a model path that is no file, ``CompositionError`` for a model name or recipe
    that does not exist or an override Hydra refuses."""
    from te_assembly.config.resolved import resolve_composed, resolve_mapping

    check_config_argument(config, "load()")
    if isinstance(overrides, str):
        raise ArgumentError(
            "overrides is a list of Hydra overrides (['model.dims.hidden=8']), not one string"
        )
    if isinstance(config, Analysis):
        if overrides or config_dirs:
            raise ArgumentError("load(analysis) takes no overrides or config_dirs: load the config again")
        return config
    if isinstance(config, Mapping):
        from te_assembly.config.source import cycle_in
        from te_assembly.diagnostics import error

        where = cycle_in(config, "model" if "model" not in config else "")
        if where is not None:
            message = "this mapping contains itself (a recursive structure): a config is a tree"
            raise ConfigError([error(where or "model", "recursive-structure", message)])
    with paused():  # see collector.py
        if isinstance(config, Mapping):
            dirs = tuple(str(d) for d in config_dirs)
            return analyze_resolved(resolve_mapping(config, overrides, config_dirs=dirs), sections)
        composed = list(overrides)
        if config is not None:
            value = str(Path(config).resolve()) if isinstance(config, os.PathLike) else str(config)
            composed = [f"model={quoted_value(value)}", *composed]
        cfg = _compose(composed, config_dirs)
        dirs = tuple(str(d) for d in config_dirs)
        return analyze_resolved(resolve_composed(cfg, task_overrides(cfg), dirs), sections)


_COMPOSED: dict[tuple[tuple[str, ...], tuple[str, ...]], Any] = {}
_COMPOSED_KEPT = 16


def load_model_file(
    path: str | os.PathLike[str],
    overrides: Sequence[str] = (),
    *,
    config_dirs: Sequence[str | os.PathLike[str]] = (),
    sections: Mapping[str, type] | None = None,
) -> Analysis:
    """``load(path, overrides, ...)`` of a model file, with Hydra's composition of everything but the
    model made once per (overrides, config folders) and reused: Hydra sees a model only as a stub naming
    its file (``config/composition.py``), so the stub is pointed at ``path`` and the rest is read as
    ``load`` reads it. What ``te_assembly.testing`` validates hundreds of files with; same diagnostics
    as ``load``."""
    from omegaconf import open_dict

    from te_assembly.config.resolved import resolve_composed

    file = str(Path(path).resolve())
    dirs = tuple(str(d) for d in config_dirs)
    key = (tuple(overrides), dirs)
    base = _COMPOSED.get(key)
    if base is None:
        base = _compose([f"model={quoted_value(file)}", *overrides], config_dirs)
        _COMPOSED[key] = base
        while len(_COMPOSED) > _COMPOSED_KEPT:
            _COMPOSED.pop(next(iter(_COMPOSED)))
    cfg = base.copy()
    with open_dict(cfg):
        cfg.model._choice_ = file
        cfg.model._source_ = file
        cfg.hydra.runtime.choices.model = file
        cfg.hydra.overrides.task = [
            f"model={quoted_value(file)}" if str(o).startswith("model=") else o
            for o in cfg.hydra.overrides.task
        ]
    with paused():
        return analyze_resolved(resolve_composed(cfg, task_overrides(cfg), dirs), sections)


CONFIG_KINDS = "a Plan, a model mapping, an Analysis, a model name or a path to a model file"
"""What ``build()`` takes as its config (``load()`` the same but a Plan, and None for the default model)."""


def check_config_argument(config: object, caller: str) -> None:
    """``ArgumentError`` (a ``TypeError``) for a config argument of the wrong type, a blank name, or a
    model file path that is no file; before Hydra turns them into a less direct message."""
    from te_assembly.config.locations import is_path_choice

    if not isinstance(config, (str, os.PathLike, Mapping, Analysis, type(None))):
        raise ArgumentError(f"{caller} expected {CONFIG_KINDS}; got {config!r} ({type(config).__name__})")
    if isinstance(config, str) and not config.strip():
        raise ArgumentError(f"{caller} expected {CONFIG_KINDS}; got {config!r}")
    if isinstance(config, os.PathLike) or (isinstance(config, str) and is_path_choice(config)):
        path = Path(config).expanduser()
        if not path.is_file():
            what = "a directory" if path.is_dir() else "no such file"
            raise ArgumentError(f"cannot load model {path}: {what}")


def task_overrides(cfg: Any) -> list[str]:
    """The overrides of this run (``hydra.overrides.task``), as written: reading them through OmegaConf
    would resolve an interpolation in an override's value."""
    from omegaconf import OmegaConf

    task = OmegaConf.select(cfg, "hydra.overrides.task")
    items = OmegaConf.to_container(task, resolve=False) if task is not None else []
    return [str(o) for o in items] if isinstance(items, list) else []


def _compose(overrides: list[str], config_dirs: Sequence[str | os.PathLike[str]]) -> Any:
    from te_assembly.config.composition import compose
    from te_assembly.config.composition_errors import describe, from_composition, syntax_error_in
    from te_assembly.errors import ConfigError

    try:
        return compose(overrides, config_dirs)
    except Exception as exc:
        if not from_composition(exc):
            raise
        syntax = syntax_error_in(exc)
        if syntax is not None:
            raise ConfigError([syntax]) from None
        raise CompositionError(describe(exc, overrides)) from None


def validate_model(model: Mapping[str, Any]) -> list:  # type: ignore[type-arg]
    """Every diagnostic for a model mapping (what a model file holds; ``${model.dims.X}`` resolved as in
    a file): ``load(model).diagnostics`` as a list. ``ArgumentError`` for anything but a mapping (a name
    or a file goes to ``load``)."""
    if not isinstance(model, Mapping):
        raise ArgumentError(
            "validate_model() takes a model mapping (what a model file holds); got "
            f"{model!r} ({type(model).__name__}): for a name or a file, use te_assembly.load(...).diagnostics"
        )
    try:
        return list(load(model).diagnostics)
    except ConfigError as exc:  # a mapping that cannot even be read as a tree (it contains itself)
        return list(exc.diagnostics)


__all__ = [
    "CONFIG_KINDS",
    "check_config_argument",
    "load",
    "load_model_file",
    "quoted_value",
    "task_overrides",
    "validate_model",
]
