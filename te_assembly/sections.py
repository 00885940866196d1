"""A config section (``run:``, ``train:``, ``bench:``, ``graph:``...) read into its settings dataclass.

A settings dataclass is the section's schema: each field is declared with ``setting(default, doc=...,
choices=..., minimum=...)`` and its annotation gives the type (``int | None`` is nullable). Everything
else reads that one declaration: ``check_section`` (unknown keys with a suggestion, and every value
through ``fields.check_value``), ``read_section`` (the dataclass, or ``ConfigError`` with every problem)
and ``section_help`` (the keys, values and one line of doc each, for ``--help``).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar, Union

from te_assembly.diagnostics import Diagnostic, did_you_mean, error
from te_assembly.errors import ConfigError
from te_assembly.fields import REQUIRED, FieldSpec, check_value, show

T = TypeVar("T")

_SPEC = "te_assembly.spec"


def setting(default: Any = dataclasses.MISSING, *, doc: str = "", **rules: Any) -> Any:
    """A dataclass field of a settings section: its default, one line of doc, and the rules of
    ``fields.FieldSpec`` (``choices``, ``minimum``, ``maximum``, ``exclusive_minimum``, ``finite``,
    ``pattern``, ``items``, ``single_as_list``, ``nonempty``). A list default is copied per instance."""
    meta = {_SPEC: {"doc": doc, **rules}}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def subsection(cls: type, *, doc: str = "") -> Any:
    """A field that is a section of its own (``data.tokenizer``): a settings dataclass, checked and read
    key by key under its parent's path."""
    return dataclasses.field(default_factory=cls, metadata={_SPEC: {"doc": doc}, _SUB: cls})


_SUB = "te_assembly.subsection"


@functools.cache
def subsections(cls: type) -> dict[str, type]:
    """Field name -> settings dataclass, for the fields declared with ``subsection``."""
    return {f.name: f.metadata[_SUB] for f in dataclasses.fields(cls) if _SUB in f.metadata}


@functools.cache  # get_type_hints evaluates string annotations: do it once per class
def section_specs(cls: type) -> dict[str, FieldSpec]:
    """Field name -> spec, from the dataclass's annotations and ``setting(...)`` declarations (not the
    ``subsection`` fields: ``subsections`` lists those)."""
    assert dataclasses.is_dataclass(cls)
    hints = typing.get_type_hints(cls)
    specs: dict[str, FieldSpec] = {}
    for f in dataclasses.fields(cls):
        if _SUB in f.metadata:
            continue
        base, nullable = _base_type(hints[f.name])
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = REQUIRED
        rules = dict(f.metadata.get(_SPEC, {}))
        specs[f.name] = FieldSpec(base, default=default, nullable=nullable, **rules)
    return specs


def _base_type(tp: Any) -> tuple[type | tuple[type, ...], bool]:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        nullable = len(args) < len(typing.get_args(tp))
        inner = tuple(_base_type(a)[0] for a in args)
        flat = tuple(t for group in inner for t in (group if isinstance(group, tuple) else (group,)))
        return (flat[0] if len(flat) == 1 else flat), nullable
    if origin in (list, tuple):
        return list, False
    return tp, False


def check_section(cls: type, raw: Any, prefix: str) -> list[Diagnostic]:
    """Every problem of section ``prefix`` (unknown keys, bad values) against dataclass ``cls``."""
    if raw is None:
        return []
    if not isinstance(raw, Mapping):
        return [
            error(prefix, "wrong-type", f"{prefix} must be mapping, got {type(raw).__name__} ({show(raw)})")
        ]
    specs = section_specs(cls)
    nested = subsections(cls)
    out: list[Diagnostic] = []
    for key, value in raw.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        spec = specs.get(str(key))
        if str(key) in nested:
            out.extend(check_section(nested[str(key)], value, path))
        elif spec is None:
            hint = did_you_mean(key, [*specs, *nested])
            where = f"{prefix} settings" if prefix else "the top-level settings"
            out.append(error(path, "unknown-key", f"unknown key {key!r} in {where}", hint))
        else:
            out.extend(check_value(spec, value, path))
    return out


def section_diagnostics(cls: type, raw: Any, prefix: str) -> list[Diagnostic]:
    """``check_section``, then the dataclass's own cross-field rules (a ``ConfigError`` from its
    ``__post_init__``), as diagnostics."""
    diags = check_section(cls, raw, prefix)
    if diags or not isinstance(raw, Mapping):
        return diags
    try:
        read_section(cls, raw, prefix)
    except ConfigError as exc:
        return exc.diagnostics
    return []


def read_section(cls: type[T], raw: Mapping[str, Any] | None, prefix: str) -> T:
    """``cls(**raw)`` after ``check_section``; raises ``ConfigError`` listing every problem. Ints given
    for float fields are widened (YAML writes ``lr: 1`` as an int); lists for tuple fields become
    tuples."""
    raw = raw or {}
    diags = check_section(cls, raw, prefix)
    if diags:
        raise ConfigError(diags)
    specs = section_specs(cls)  # type: ignore[arg-type]
    nested = subsections(cls)  # type: ignore[arg-type]
    values = {
        str(k): read_section(nested[str(k)], v, f"{prefix}.{k}")
        if str(k) in nested
        else _coerce(specs[str(k)], v)
        for k, v in raw.items()
    }
    return cls(**values)


def _coerce(spec: FieldSpec, value: Any) -> Any:
    types_ = spec.type if isinstance(spec.type, tuple) else (spec.type,)
    if float in types_ and int not in types_ and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if spec.items is not None and spec.single_as_list and not isinstance(value, (list, tuple)):
        return None if value is None and spec.nullable else [value]  # null stays null
    return value


def section_help(cls: type, values: Mapping[str, Any] | None, prefix: str) -> list[tuple[str, str, str]]:
    """``(key, current value, doc)`` for each field, in declaration order, for ``--help``."""
    values = values or {}
    rows = []
    for name, sub in subsections(cls).items():
        inner = values.get(name)
        rows.extend(section_help(sub, inner if isinstance(inner, Mapping) else None, f"{prefix}.{name}"))
    for name, spec in section_specs(cls).items():
        value = values.get(name, spec.default)
        key = f"{prefix}.{name}" if prefix else name
        doc = spec.doc
        if spec.choices is not None and spec.choices_text not in doc:
            doc = f"{doc} ({spec.choices_text})" if doc else spec.choices_text
        rows.append((key, show(value) if not isinstance(value, str) else value, doc))
    return rows


__all__ = [
    "check_section",
    "read_section",
    "section_diagnostics",
    "section_help",
    "section_specs",
    "setting",
    "subsection",
    "subsections",
]
