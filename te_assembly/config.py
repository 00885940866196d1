"""From YAML files and Hydra overrides to a plain, resolved model mapping with source lines.

Hydra composes (``model=moe_block recipe=mxfp8 model.dims.hidden=128``); this module adds what the
validator needs on top: interpolations resolved leaf by leaf (so every bad one is reported), YAML
syntax errors as diagnostics, and the file:line of every key of the model file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from te_assembly.diagnostics import Diagnostic, closest, did_you_mean, error, sort_diagnostics
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
                diags.append(_bad_interpolation(child, node, exc))
                continue
            out[str(key)] = to_plain(value, child, diags)
        return out
    if isinstance(node, ListConfig):
        items = []
        for i in range(len(node)):
            try:
                value = node[i]
            except Exception as exc:
                diags.append(_bad_interpolation(f"{path}[{i}]", node, exc))
                continue
            items.append(to_plain(value, f"{path}[{i}]", diags))
        return items
    return node


_MISSING_KEY = re.compile(r"Interpolation key '([^']+)' not found")


def _bad_interpolation(path: str, node: DictConfig | ListConfig, exc: Exception) -> Diagnostic:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    missing = _MISSING_KEY.search(first)
    hint = suggest_key(node._get_root(), missing.group(1)) if missing else None
    return error(path, "bad-interpolation", f"cannot resolve value: {first}", hint)


def suggest_key(root: Any, dotted: str) -> str | None:
    """For a key path that does not exist in ``root``: the path with its first wrong component replaced
    by the closest existing key, and the keys that do exist there. None when nothing is close."""
    parts = dotted.split(".")
    node = root
    for i, part in enumerate(parts):
        keys = _child_keys(node)
        if keys is None:
            return None
        if part in keys:
            try:
                node = node[int(part)] if isinstance(node, ListConfig) else node._get_node(part)
            except Exception:
                return None
            continue
        match = closest(part, keys)
        parent = ".".join(parts[:i]) or "the config root"
        listed = f"{parent} has: {', '.join(sorted(keys))}" if keys else f"{parent} is empty"
        if match is None:
            return listed
        return f"did you mean {'.'.join([*parts[:i], match, *parts[i + 1 :]])!r}? {listed}"
    return None


def _child_keys(node: Any) -> list[str] | None:
    if isinstance(node, DictConfig):
        return [str(k) for k in node.keys()]
    if isinstance(node, ListConfig):
        return [str(i) for i in range(len(node))]
    return None


def resolve_model(model: Mapping[str, Any]) -> tuple[dict[str, Any], list[Diagnostic]]:
    """A model mapping from Python (``yaml.safe_load`` of a model file, a hand-built dict) with its
    ``${model.dims.X}`` interpolations resolved as a loaded file's are; the mapping unchanged, and no
    diagnostics, when it holds no interpolation."""
    if isinstance(model, DictConfig):
        if model._get_parent() is not None:  # the ``model`` node of a composed config: resolve in place
            diags: list[Diagnostic] = []
            return to_plain(model, "model", diags), diags
        # A model file loaded on its own (``OmegaConf.load``): its ``${model.*}`` need a ``model`` root.
        model = OmegaConf.to_container(model, resolve=False)  # type: ignore[assignment]
    if not _has_interpolation(model):
        return dict(model), []
    try:
        cfg = OmegaConf.create({"model": dict(model)})
    except Exception:
        return dict(model), []  # not a plain-data tree (e.g. a live object): validation says what is wrong
    diags = []
    return to_plain(cfg.model, "model", diags), diags


def _has_interpolation(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "${" in item:
                return True
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


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


def _choice_of(group: str, overrides: Sequence[str]) -> str:
    """The option a command line picks for a config group (``model=moe_block``), or ""."""
    for item in reversed(overrides):
        key, sep, value = item.partition("=")
        if sep and key.lstrip("+~") == group:
            return value
    return ""


def _unknown_choice(group: str, choice: str, available: Sequence[str]) -> str:
    hint = did_you_mean(choice, available)
    return (
        f"unknown {group} {choice!r}"
        + (f" ({hint})" if hint else "")
        + f"\navailable {group}s: {', '.join(available)}"
    )


def _model_choice(overrides: Sequence[str]) -> str:
    chosen = _choice_of("model", overrides)
    if chosen:
        return chosen
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
    try:
        cfg = _hydra_compose(overrides)
    except (HydraException, OmegaConfBaseException, yaml.YAMLError) as exc:
        raise CompositionError(_composition_message(exc, choice, overrides)) from None
    load_diags: list[Diagnostic] = []
    model = to_plain(cfg.model, "model", load_diags) if "model" in cfg else {}
    lines = yaml_lines(text, "model") if text is not None else {}
    file = str(model_path) if text is not None else None
    return LoadedConfig(cfg, model, file, lines, locate(load_diags, file, lines))


def _hydra_compose(overrides: Sequence[str]) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base=None):
            return hydra_compose(config_name="config", overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()


_CANNOT_OVERRIDE = re.compile(r"Could not override '([^']+)'")


def _composition_message(exc: Exception, choice: str, overrides: Sequence[str]) -> str:
    # Hydra appends its search path to "not found" messages: noise for a user picking a model.
    text = str(exc).strip().split("\nConfig search path:")[0].rstrip()
    if "model" in text and choice and choice not in available_models():
        return _unknown_choice("model", choice, available_models())
    recipe = _choice_of("recipe", overrides)
    if recipe and "recipe" in text:
        from te_assembly import recipes

        if recipe not in recipes.available_recipes():
            return _unknown_choice("recipe", recipe, recipes.available_recipes())
    missing = _CANNOT_OVERRIDE.search(text)
    if missing is not None:
        hint = _override_hint(missing.group(1), overrides)
        if hint:
            text += f"\n{hint}"
    return text


def _override_hint(key: str, overrides: Sequence[str]) -> str | None:
    """Did-you-mean for an override of a key that does not exist: compose again without it (a second
    Hydra run, only on this error path) and look for close keys where it should have been."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    rest = [o for o in overrides if o.partition("=")[0].lstrip("+~") != key]
    try:
        cfg = _hydra_compose(rest)
    except (HydraException, OmegaConfBaseException, yaml.YAMLError):
        return None
    return suggest_key(cfg, key)
