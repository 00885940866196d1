"""From YAML files and Hydra overrides to a plain, resolved model mapping with source lines.

Hydra composes (``model=moe_block recipe=mxfp8 model.dims.hidden=128``); this module adds what the
validator needs on top: interpolations resolved leaf by leaf (so every bad one is reported), YAML
syntax errors as diagnostics, and the file:line of every key of the model file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from te_assembly.diagnostics import Diagnostic, error, sort_diagnostics
from te_assembly.errors import CompositionError, ConfigError

_PACKAGE_DIR = Path(__file__).resolve().parent


def _mul(*factors: Any) -> Any:
    result: Any = 1
    for f in factors:
        result *= f
    return result


# Configs need simple arithmetic on dims (``${mul:2,${model.dims.ffn}}`` for a GLU's doubled width).
OmegaConf.register_new_resolver("mul", _mul, replace=True)


def config_dir() -> Path:
    """Shipped configs: inside the installed package, or the repo's ``configs/`` in a checkout."""
    packaged = _PACKAGE_DIR / "_configs"
    return packaged if packaged.is_dir() else _PACKAGE_DIR.parent / "configs"


def available_models() -> list[str]:
    return sorted(p.stem for p in (config_dir() / "model").glob("*.yaml"))


@dataclass
class LoadedConfig:
    cfg: DictConfig
    """The whole composed config (model, recipe, engine, ...), interpolations unresolved."""
    model: dict[str, Any]
    """The resolved ``model`` node as plain data."""
    file: str | None = None
    lines: dict[str, int] = field(default_factory=dict)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    """Problems found while loading (YAML syntax, interpolation): validation adds the rest."""


# libyaml parses about ten times faster; the pure-Python loader words syntax errors better.
_FAST_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def yaml_lines(text: str, prefix: str) -> dict[str, int]:
    """Map each key path (``model.ops[3].args``) to its 1-based line in the YAML text."""
    lines: dict[str, int] = {}

    def walk(node: yaml.Node, path: str) -> None:
        lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                child = f"{path}.{key.value}"
                lines[child] = key.start_mark.line + 1
                walk(value, child)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, f"{path}[{i}]")

    root = yaml.compose(text, Loader=_FAST_LOADER)
    if root is not None:
        walk(root, prefix)
    return lines


def syntax_diagnostics(text: str, file: str, prefix: str = "model") -> list[Diagnostic]:
    try:
        yaml.load(text, Loader=_FAST_LOADER)
        return []
    except yaml.YAMLError as fast_exc:
        exc: yaml.YAMLError = fast_exc
    try:
        yaml.safe_load(text)  # only for its wording of the error
    except yaml.YAMLError as slow_exc:
        exc = slow_exc
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    diag = error(prefix, "yaml-syntax", f"YAML syntax error: {problem}")
    return [diag.located(file, mark.line + 1 if mark is not None else None)]


def to_plain(node: Any, path: str, diags: list[Diagnostic]) -> Any:
    """Resolve interpolations one leaf at a time, turning each failure into a diagnostic."""
    if isinstance(node, DictConfig):
        out: dict[str, Any] = {}
        for key in node.keys():
            child = f"{path}.{key!s}"
            try:
                value = node[key]
            except Exception as exc:
                diags.append(error(child, "bad-interpolation", _omegaconf_message(exc)))
                continue
            out[str(key)] = to_plain(value, child, diags)
        return out
    if isinstance(node, ListConfig):
        items = []
        for i in range(len(node)):
            try:
                value = node[i]
            except Exception as exc:
                diags.append(error(f"{path}[{i}]", "bad-interpolation", _omegaconf_message(exc)))
                continue
            items.append(to_plain(value, f"{path}[{i}]", diags))
        return items
    return node


def _omegaconf_message(exc: Exception) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"cannot resolve value: {first}"


def locate(diags: Sequence[Diagnostic], file: str | None, lines: Mapping[str, int]) -> list[Diagnostic]:
    """Attach file:line to each diagnostic, using the nearest enclosing key the YAML names; the result
    is in source order."""
    out = []
    for d in diags:
        root = next(iter(lines), "").split(".")[0].split("[")[0]
        if d.line is not None or file is None or not (d.path == root or d.path.startswith(root + ".")):
            out.append(d)
            continue
        path = d.path
        while path and path not in lines:
            path = _parent(path)
        out.append(d.located(file, lines.get(path)))
    return sort_diagnostics(out)


def _parent(path: str) -> str:
    cut = max(path.rfind("."), path.rfind("["))
    return path[:cut] if cut > 0 else ""


def load_model_text(text: str, file: str = "<string>") -> LoadedConfig:
    """Load one model YAML document (the contents of a ``configs/model/*.yaml`` file)."""
    diags = syntax_diagnostics(text, file)
    if diags:
        return LoadedConfig(OmegaConf.create({}), {}, file, {}, diags)
    data = yaml.load(text, Loader=_FAST_LOADER) or {}
    if not isinstance(data, dict):
        diag = error("model", "wrong-type", "a model file must be a mapping").located(file, 1)
        return LoadedConfig(OmegaConf.create({}), {}, file, {}, [diag])
    cfg = OmegaConf.create({"model": data})
    load_diags: list[Diagnostic] = []
    model = to_plain(cfg.model, "model", load_diags)
    lines = yaml_lines(text, "model")
    return LoadedConfig(cfg, model, file, lines, locate(load_diags, file, lines))


def load_model_file(path: str | Path) -> LoadedConfig:
    p = Path(path)
    return load_model_text(p.read_text(), str(p))


def _model_choice(overrides: Sequence[str]) -> str:
    for item in reversed(overrides):
        key, sep, value = item.partition("=")
        if sep and key.lstrip("+~") == "model":
            return value
    defaults = yaml.safe_load((config_dir() / "config.yaml").read_text()).get("defaults", [])
    for entry in defaults:
        if isinstance(entry, dict) and "model" in entry:
            return str(entry["model"])
    return ""


def _register_recipes() -> None:
    from hydra.core.config_store import ConfigStore

    from te_assembly import recipes

    store = ConfigStore.instance()
    for name in recipes.available_recipes():
        store.store(group="recipe", name=name, node=recipes.load_recipe(name))


def compose(overrides: Sequence[str]) -> LoadedConfig:
    """Compose ``configs/config.yaml`` with Hydra overrides; raise ``CompositionError`` or
    ``ConfigError`` (YAML syntax) with a short message, never a Hydra traceback."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    choice = _model_choice(overrides)
    model_path = config_dir() / "model" / f"{choice}.yaml"
    text = model_path.read_text() if model_path.is_file() else None
    if text is not None:
        diags = syntax_diagnostics(text, str(model_path))
        if diags:
            raise ConfigError(diags)
    _register_recipes()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base=None):
            cfg = hydra_compose(config_name="config", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException, yaml.YAMLError) as exc:
        raise CompositionError(_composition_message(exc, choice)) from None
    finally:
        GlobalHydra.instance().clear()
    load_diags: list[Diagnostic] = []
    model = to_plain(cfg.model, "model", load_diags) if "model" in cfg else {}
    lines = yaml_lines(text, "model") if text is not None else {}
    file = str(model_path) if text is not None else None
    return LoadedConfig(cfg, model, file, lines, locate(load_diags, file, lines))


def _composition_message(exc: Exception, choice: str) -> str:
    # Hydra appends its search path to "not found" messages: noise for a user picking a model.
    text = str(exc).strip().split("\nConfig search path:")[0].rstrip()
    if "model" in text and choice and choice not in available_models():
        from te_assembly.diagnostics import did_you_mean

        hint = did_you_mean(choice, available_models())
        text = f"unknown model {choice!r}" + (f" ({hint})" if hint else "")
        text += f"\navailable models: {', '.join(available_models())}"
    return text
