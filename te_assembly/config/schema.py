"""The model schema: dataclasses are the schema, YAML is the data.

``check_structure`` walks plain data against these dataclasses and reports every mismatch at once
(OmegaConf's structured configs stop at the first one); scalar values go through the shared field
checker (``fields.py``), so a wrong type reads the same here as in every settings section.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Union

from te_assembly.diagnostics import Diagnostic, did_you_mean, error
from te_assembly.fields import FieldSpec, check_value, show


@dataclass
class OutputBinding:
    """Where an extra output goes: a channel name, and whether the caller also gets it."""

    channel: str | None = None
    public: bool = True


@dataclass
class UseConfig:
    """One use of a block, in a block step's ``uses`` list."""

    dims: dict[str, Any] | None = field(default_factory=dict)
    """This use's values for the block's dims (over the step's ``dims``)."""


@dataclass
class StepConfig:
    """One step: a fusible ``op`` from the catalog, a non-fusible ``module`` from the allowlist, or a
    ``block`` used ``repeat`` times (or once per item of ``uses``), expanded in place."""

    name: str
    op: str | None = None
    module: str | None = None
    block: str | None = None
    """A block by name (``configs/block/<name>.yaml``, ``DIR/block/<name>.yaml`` with ``-cd DIR``, or the
    model's ``blocks:``) or by path (``layer.yaml``, relative to the model file)."""
    repeat: int | None = field(default=None, metadata={"minimum": 1})
    """How many uses of the block (default 1); or give ``uses``."""
    uses: list[UseConfig] | None = None
    dims: dict[str, Any] | None = None
    """The block's dims for every use (over the block's own defaults)."""
    # null means empty for the three mappings: ``args:`` with nothing under it is how YAML spells it.
    args: dict[str, Any] | None = field(default_factory=dict)
    extra_inputs: dict[str, str | None] | None = field(default_factory=dict)
    """Input slot name -> channel name, or null for a public input named ``<step>_<slot>``."""
    extra_outputs: dict[str, OutputBinding] | None = field(default_factory=dict)
    """Output slot name -> binding. Unlisted outputs are public, named ``<step>_<slot>``."""
    tie_weight: str | None = None
    """Share this step's weight with another step's, by that step's full name (a vocabulary head tied
    to the embedding: one Parameter in both engines, stored once)."""
    doc: str = ""


@dataclass
class ModelConfig:
    name: str
    in_features: int = field(metadata={"minimum": 1})
    """Feature width of the main input tensor ``x``."""
    ops: list[StepConfig] = field(default_factory=list, metadata={"required": True})
    description: str = ""
    dims: dict[str, Any] = field(default_factory=dict)
    """Free-form numbers for ``${model.dims.X}`` interpolation."""
    input_layout: str | None = field(
        default=None, metadata={"choices": ("any", "tokens", "sequence", "token_ids")}
    )
    """What ``x`` looks like: ``any`` ``[..., features]``, ``tokens`` ``[tokens, features]``, ``sequence``
    ``[batch, seq, features]``, ``token_ids`` ``[batch, seq]`` int64 ids below ``in_features`` (a language
    model); null: the first step that needs a layout of ``x`` decides (``analysis/layouts.py``)."""
    blocks: dict[str, Any] = field(default_factory=dict)
    """Blocks defined in the model file, by name (each laid out like a block file)."""


@dataclass
class BlockConfig:
    """A block file (``configs/block/<name>.yaml``) or an entry of a model's ``blocks:``: an op list with
    its own dims, channels and public tensors, used by model steps any number of times."""

    ops: list[Any] = field(default_factory=list, metadata={"required": True})
    """Steps, as in a model; each use's are checked as the model's own (with the block's file:line)."""
    name: str | None = None
    """Documentation: a block is referred to by its file name or ``blocks:`` key."""
    description: str = ""
    dims: dict[str, Any] = field(default_factory=dict)
    """Defaults for ``${block.dims.X}``; a model step's ``dims`` and each use's override them."""


@dataclass(frozen=True)
class _Field:
    tp: Any
    required: bool
    rules: dict[str, Any]
    fast: tuple[type, ...]
    """Exact value types that are valid without further checks (the common case, kept cheap)."""


def _fast_types(tp: Any, rules: dict[str, Any]) -> tuple[type, ...]:
    if rules:
        return ()
    if tp in (str, bool):
        return (tp,)
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = typing.get_args(tp)
        if all(a in (str, bool, type(None)) for a in args):
            return tuple(args)
    return ()


@functools.cache  # get_type_hints evaluates string annotations: far too slow to redo for every step
def _fields(cls: type) -> dict[str, _Field]:
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        rules = dict(f.metadata)
        missing = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        required = bool(rules.pop("required", missing))
        out[f.name] = _Field(hints[f.name], required, rules, _fast_types(hints[f.name], rules))
    return out


@functools.cache
def _scalar_spec(tp: type, rules: tuple[tuple[str, Any], ...]) -> FieldSpec:
    return FieldSpec(tp, **dict(rules))


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is dict:
        return "mapping"
    if origin is list:
        return "list"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


@functools.cache
def _shape(tp: Any) -> tuple[str, tuple[Any, ...]]:
    """What kind of annotation ``tp`` is (``any``, ``optional``, ``union``, ``dataclass``, ``dict``,
    ``list``, ``scalar``, ``other``) and its arguments; cached, since typing's introspection is slow."""
    if tp is Any:
        return "any", ()
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        inner = tuple(o for o in typing.get_args(tp) if o is not type(None))
        return ("optional" if len(inner) == 1 else "union"), inner
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return "dataclass", ()
    if origin is dict:
        return "dict", typing.get_args(tp)
    if origin is list:
        return "list", typing.get_args(tp)
    if tp in (int, str, bool, float):
        return "scalar", ()
    return "other", ()


def check_structure(tp: Any, value: Any, path: str, rules: dict[str, Any] | None = None) -> list[Diagnostic]:
    """Every place where ``value`` does not fit the annotated type ``tp`` (and, for a scalar, the
    field's ``rules``: ``minimum``...)."""
    kind, args = _shape(tp)
    if kind == "optional":
        if value is None:
            return []
        tp = args[0]
        kind, args = _shape(tp)
    if kind in ("any", "union", "other"):
        return []
    if kind == "dataclass":
        return _check_dataclass(tp, value, path)
    if kind == "dict":
        if not isinstance(value, dict):
            return [_wrong_type(path, tp, value)]
        if args[1] is Any:
            return []
        return [d for k, v in value.items() for d in check_structure(args[1], v, f"{path}.{k}")]
    if kind == "list":
        if not isinstance(value, list):
            return [_wrong_type(path, tp, value)]
        return [d for i, v in enumerate(value) for d in check_structure(args[0], v, f"{path}[{i}]")]
    if not rules and type(value) is tp:
        return []
    return check_value(_scalar_spec(tp, tuple(sorted((rules or {}).items()))), value, path, _label(path))


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
    for name, f in fields.items():
        if name in value:
            item = value[name]
            if type(item) in f.fast:
                continue
            out.extend(check_structure(f.tp, item, f"{path}.{name}", f.rules))
        elif f.required:
            out.append(error(f"{path}.{name}", "missing-key", f"missing required key {name!r}"))
    return out


def _label(path: str) -> str:
    """How a message names the value at ``path``: its key, or ``ops[3]`` for a list item."""
    tail = path.rsplit(".", 1)[-1]
    return tail


def _wrong_type(path: str, tp: Any, value: Any) -> Diagnostic:
    got = "null" if value is None else f"{type(value).__name__} ({show(value)})"
    return error(path, "wrong-type", f"{_label(path)} must be {_type_name(tp)}, got {got}")


def is_step_name(name: str) -> bool:
    """An identifier, or identifiers and numbers joined by dots, the first an identifier: the steps of a
    block's uses are ``<step>.<use>.<block step>``, and parameters nest the same way
    (``steps.layers.3.norm.weight``)."""
    first, *rest = name.split(".")
    return first.isidentifier() and all(p.isidentifier() or _USE_NUMBER.fullmatch(p) for p in rest)


_USE_NUMBER = re.compile(r"0|[1-9][0-9]*")
