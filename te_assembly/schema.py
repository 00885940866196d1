"""The model schema: dataclasses are the schema, YAML is the data.

``check_structure`` walks plain data against these dataclasses and reports every mismatch at once
(OmegaConf's structured configs stop at the first one).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Union

from te_assembly.diagnostics import Diagnostic, did_you_mean, error


@dataclass
class OutputBinding:
    """Where an extra output goes: a channel name, and whether the caller also gets it."""

    channel: str | None = None
    public: bool = True


@dataclass
class StepConfig:
    """One step: a fusible ``op`` from the catalog, or a non-fusible ``module`` from the allowlist."""

    name: str
    op: str | None = None
    module: str | None = None
    # null means empty for the three mappings: ``args:`` with nothing under it is how YAML spells it.
    args: dict[str, Any] | None = field(default_factory=dict)
    extra_inputs: dict[str, str | None] | None = field(default_factory=dict)
    """Input slot name -> channel name, or null for a public input named ``<step>_<slot>``."""
    extra_outputs: dict[str, OutputBinding] | None = field(default_factory=dict)
    """Output slot name -> binding. Unlisted outputs are public, named ``<step>_<slot>``."""
    doc: str = ""


@dataclass
class ModelConfig:
    name: str
    in_features: int
    """Feature width of the main input tensor ``x``."""
    ops: list[StepConfig]
    description: str = ""
    dims: dict[str, Any] = field(default_factory=dict)
    """Free-form numbers for ``${model.dims.X}`` interpolation."""


@functools.cache  # get_type_hints evaluates string annotations: far too slow to redo for every step
def _fields(cls: type) -> dict[str, tuple[Any, bool]]:
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        out[f.name] = (hints[f.name], required)
    return out


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is dict:
        return "mapping"
    if origin is list:
        return "list"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def check_structure(tp: Any, value: Any, path: str) -> list[Diagnostic]:
    """Every place where ``value`` does not fit the annotated type ``tp``."""
    if tp is Any:
        return []
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return []
        inner = [o for o in options if o is not type(None)]
        return check_structure(inner[0], value, path) if len(inner) == 1 else []
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _check_dataclass(tp, value, path)
    if origin is dict:
        if not isinstance(value, dict):
            return [_wrong_type(path, tp, value)]
        _, val_tp = typing.get_args(tp)
        return [d for k, v in value.items() for d in check_structure(val_tp, v, f"{path}.{k}")]
    if origin is list:
        if not isinstance(value, list):
            return [_wrong_type(path, tp, value)]
        (item_tp,) = typing.get_args(tp)
        return [d for i, v in enumerate(value) for d in check_structure(item_tp, v, f"{path}[{i}]")]
    if tp is int and (isinstance(value, bool) or not isinstance(value, int)):
        return [_wrong_type(path, tp, value)]
    if tp in (str, bool) and not isinstance(value, tp):
        return [_wrong_type(path, tp, value)]
    return []


def _check_dataclass(cls: type, value: Any, path: str) -> list[Diagnostic]:
    if not isinstance(value, dict):
        return [_wrong_type(path, cls, value)]
    fields = _fields(cls)
    out: list[Diagnostic] = []
    for key in value:
        if key not in fields:
            out.append(
                error(
                    f"{path}.{key}",
                    "unknown-key",
                    f"unknown key {key!r} in {cls.__name__}",
                    did_you_mean(key, fields),
                )
            )
    for name, (tp, required) in fields.items():
        if name in value:
            out.extend(check_structure(tp, value[name], f"{path}.{name}"))
        elif required:
            out.append(error(f"{path}.{name}", "missing-key", f"missing required key {name!r}"))
    return out


def _wrong_type(path: str, tp: Any, value: Any) -> Diagnostic:
    shown = "null" if value is None else type(value).__name__
    return error(path, "wrong-type", f"expected {_type_name(tp)}, got {shown} ({value!r})")
