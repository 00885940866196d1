"""What every command does first: compose, validate, and fail with all diagnostics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import GrammarParseError, InterpolationResolutionError, MissingMandatoryValue
from rich.console import Console

from te_assembly.config import LoadedConfig, compose, locate, yaml_lines
from te_assembly.diagnostics import Diagnostic, dedupe, error, has_errors, sort_diagnostics
from te_assembly.errors import ConfigError
from te_assembly.plan import Plan
from te_assembly.validate import analyze


def load_and_validate(overrides: Sequence[str]) -> tuple[LoadedConfig, list[Diagnostic], Plan | None]:
    loaded = compose(overrides)
    diags, plan = analyze(loaded.model)
    extra = list(loaded.diagnostics)
    diags = locate([*extra, *diags], loaded.file, loaded.lines)
    parallel = locate(_parallel_diagnostics(loaded, plan), loaded.file, loaded.lines)
    diags = dedupe(sort_diagnostics([*diags, *_recipe_diagnostics(loaded, plan), *parallel]))
    return loaded, diags, (None if has_errors(diags) else plan)


def section(cfg: DictConfig, key: str) -> dict[str, Any]:
    """A config node as a plain dict with interpolations resolved; empty when the key is absent."""
    node = cfg.get(key)
    data = OmegaConf.to_container(node, resolve=True) if node is not None else {}
    assert isinstance(data, dict)
    return {str(k): v for k, v in data.items()}


RESOLUTION_ERRORS = (InterpolationResolutionError, MissingMandatoryValue, GrammarParseError)
"""What OmegaConf raises when a value's interpolation (``${oc.env:NOPE}``, ``???``) cannot resolve."""


def setting(cfg: DictConfig, key: str) -> Any:
    """The resolved value at ``key`` (dotted); an interpolation that cannot resolve is a config error
    at that key, not an OmegaConf traceback."""
    try:
        return OmegaConf.select(cfg, key, throw_on_resolution_failure=True, throw_on_missing=True)
    except RESOLUTION_ERRORS as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError([error(key, "bad-interpolation", f"cannot resolve value: {first}")]) from None


def _parallel_diagnostics(loaded: LoadedConfig, plan: Plan | None) -> list[Diagnostic]:
    """The ``parallel:`` section against the model (te_assembly.parallel.checks; pure Python)."""
    from te_assembly.parallel.checks import parallel_diagnostics

    return parallel_diagnostics(section(loaded.cfg, "parallel"), plan)[1]


def _recipe_diagnostics(loaded: LoadedConfig, plan: Plan | None = None) -> list[Diagnostic]:
    if "recipe" not in loaded.cfg:
        return []
    from te_assembly.recipes import recipe_dir, validate_recipe
    from te_assembly.validate.recipe_shapes import recipe_shape_diagnostics

    recipe = section(loaded.cfg, "recipe")
    diags = validate_recipe(recipe, prefix="recipe")
    source = recipe_dir() / f"{recipe.get('name', '')}.yaml"
    if diags and source.is_file():
        diags = locate(diags, str(source), yaml_lines(source.read_text(), "recipe"))
    if plan is not None and not has_errors(diags):
        # Model dimensions the recipe's GEMMs cannot run, located in the model file.
        diags += locate(recipe_shape_diagnostics(plan.steps, recipe), loaded.file, loaded.lines)
    return diags


def require_plan(overrides: Sequence[str], console: Console) -> tuple[LoadedConfig, Plan]:
    """Compose and validate; print warnings; raise ConfigError (exit 2) on any error."""
    loaded, diags, plan = load_and_validate(overrides)
    if plan is None:
        raise ConfigError(diags)
    if diags:
        from te_assembly.cli.report import print_diagnostics

        print_diagnostics(diags, console)
    return loaded, plan
