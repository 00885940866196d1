"""Pass 2, overrides: ``model.*`` (and ``recipe.*``) command-line overrides applied to plain data.

Hydra parses every override (its grammar, its value types, its sweeps); only applying them to the model
and recipe happens here, because those never become OmegaConf nodes (``composition.py`` says why). The
rules are Hydra's: ``key=value`` changes an existing key (a mapping value merges into a mapping), ``+key=
value`` adds a new one, ``++key=value`` sets it either way, ``~key`` deletes it. Each failure is one
diagnostic at the override's key path, with the keys that do exist there.

The input data is never modified: containers on an overridden path are copied.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from te_assembly.config.interpolate import find_sites, suggest_key
from te_assembly.config.source import Key
from te_assembly.diagnostics import Diagnostic, error
from te_assembly.errors import OverrideRefused


@dataclass(frozen=True)
class Applied:
    data: Any
    diagnostics: tuple[Diagnostic, ...]
    sites: tuple[tuple[Key, ...], ...]
    """Interpolation sites the override values brought in."""


def held_back(override: Any, groups: Sequence[str]) -> bool:
    """True for a value override below one of ``groups`` (``model.dims.hidden=8``, ``~model.x``), as
    opposed to the group choice itself (``model=moe_block``)."""
    key = override.key_or_group
    return override.package is None and any(key.startswith(f"{g}.") for g in groups)


def apply(data: Any, overrides: Sequence[Any], prefix: str) -> Applied:
    """``data`` (the ``prefix`` section) with each Hydra ``Override`` below ``prefix`` applied in order."""
    diags: list[Diagnostic] = []
    sites: list[tuple[Key, ...]] = []
    for override in overrides:
        keys = _keys(override.key_or_group[len(prefix) + 1 :])
        try:
            data, value = _apply_one(data, keys, override, prefix)
        except OverrideRefused as exc:
            diags.append(error(exc.path, "bad-override", str(exc), exc.hint))
            continue
        if value is not None:
            sites.extend(tuple(_as_keys(data, keys)) + tuple(s) for s in find_sites(value))
    return Applied(data, tuple(diags), tuple(sites))


def _keys(dotted: str) -> list[str]:
    return [k for k in dotted.split(".") if k != ""]


def _path(prefix: str, keys: Sequence[Key]) -> str:
    out = prefix
    for key in keys:
        out = f"{out}[{key}]" if isinstance(key, int) else f"{out}.{key}"
    return out


def _as_keys(data: Any, keys: Sequence[str]) -> list[Key]:
    """Override components as data keys: a numeric component indexes a list."""
    out: list[Key] = []
    node = data
    for key in keys:
        if isinstance(node, list) and key.lstrip("-").isdigit():
            out.append(int(key))
            index = int(key)
            node = node[index] if -len(node) <= index < len(node) else None
        else:
            out.append(key)
            node = node.get(key) if isinstance(node, Mapping) else None
    return out


def _apply_one(data: Any, keys: list[str], override: Any, prefix: str) -> tuple[Any, Any]:
    line = override.input_line or ""
    if override.is_sweep_override():
        raise OverrideRefused(f"cannot sweep {line!r} in a single run (add --multirun)", _path(prefix, keys))
    if not keys:
        raise OverrideRefused(f"override {line!r} names no key below {prefix}", prefix)
    value = override.value()  # for ``~key=value``, the value the key must have
    root: Any = data  # nested as the dotted prefix reads (block.moe_layer: {block: {moe_layer: ...}})
    for part in reversed(prefix.split(".")):
        root = {part: root}
    # Walk to the parent, copying each container on the way (the input is shared with the source).
    out = _copy(data)
    node: Any = out
    walked: list[Key] = []
    creating = override.is_add() or override.is_force_add()
    for key in keys[:-1]:
        step = _index(node, key)
        child = _get(node, step)
        if child is _MISSING and isinstance(node, list):
            raise _out_of_range(line, key, node, prefix, walked)
        if child is _MISSING:
            if not creating:
                raise _missing(root, prefix, walked, key, line, override)
            child = {}
        elif not isinstance(child, (Mapping, list)):
            if not creating:
                raise _missing(root, prefix, walked, key, line, override)
            child = {}
        child = _copy(child)
        node[step] = child
        walked.append(step)
        node = child
    last = _index(node, keys[-1])
    current = _get(node, last)
    if override.is_delete():
        if current is _MISSING:
            raise OverrideRefused(
                f"Could not delete from config: {_dotted(prefix, keys)!r} does not exist",
                _path(prefix, [*walked, last]),
                suggest_key(root, _dotted(prefix, keys)),
            )
        if value is not None and value != current:
            raise OverrideRefused(
                f"Could not delete from config: the value of {_dotted(prefix, keys)!r} is {current!r}, "
                f"not {value!r}",
                _path(prefix, [*walked, last]),
            )
        del node[last]
        return out, None
    if current is _MISSING and isinstance(node, list):
        raise _out_of_range(line, keys[-1], node, prefix, walked)
    if override.is_add() and current is not _MISSING and not isinstance(value, (Mapping, list)):
        raise OverrideRefused(
            f"Could not append to config: an item is already at {_dotted(prefix, keys)!r} "
            f"(remove the + to change it, or use ++ to add or change)",
            _path(prefix, [*walked, last]),
        )
    if current is _MISSING and not creating:
        raise _missing(root, prefix, walked, keys[-1], line, override)
    if isinstance(value, Mapping) and isinstance(current, Mapping):
        value = _merge(current, value)
    node[last] = value
    return out, value


_MISSING = object()


def _index(node: Any, key: str) -> Key:
    if isinstance(node, list) and key.lstrip("-").isdigit():
        return int(key)
    return key


def _get(node: Any, key: Key) -> Any:
    if isinstance(node, Mapping):
        return node.get(str(key), _MISSING)
    if isinstance(node, list) and isinstance(key, int):
        return node[key] if -len(node) <= key < len(node) else _MISSING
    return _MISSING


def _copy(node: Any) -> Any:
    if isinstance(node, Mapping):
        return dict(node)
    if isinstance(node, list):
        return list(node)
    return {}


def _merge(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """OmegaConf's merge of plain data: mappings merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in patch.items():
        old = out.get(key)
        out[key] = _merge(old, value) if isinstance(old, Mapping) and isinstance(value, Mapping) else value
    return out


def merge(base: Any, patch: Any) -> Any:
    """``patch`` merged into ``base`` (both plain data), as Hydra merges configs."""
    if isinstance(base, Mapping) and isinstance(patch, Mapping):
        return _merge(base, patch)
    return patch


def _dotted(prefix: str, keys: Sequence[str]) -> str:
    return ".".join([prefix, *keys])


def _out_of_range(line: str, key: str, node: list[Any], prefix: str, walked: list[Key]) -> OverrideRefused:
    return OverrideRefused(
        f"Could not override {line!r}: list index {key} is out of range ({len(node)} items)",
        _path(prefix, walked),
    )


def _missing(
    root: Any, prefix: str, walked: list[Key], key: str, line: str, override: Any
) -> OverrideRefused:
    dotted = ".".join([prefix, *map(str, walked), key])
    hint = suggest_key(root, dotted)
    if override.is_add() or override.is_force_add():
        return OverrideRefused(
            f"Could not override {line!r}: {dotted!r} is not a mapping", _path(prefix, walked), hint
        )
    return OverrideRefused(
        f"Could not override {dotted!r}: no such key (to add it, use +{line})",
        _path(prefix, [*walked, key]),
        hint,
    )


__all__ = ["Applied", "apply", "held_back", "merge"]
