"""What a value may be, and the one checker every config value goes through.

Run settings, the ``train:``/``bench:``/``graph:`` sections, recipe fields and op arguments all declare
their values as ``FieldSpec``s and are checked by ``check_value``, so one kind of mistake has one code
and one wording wherever it is made:

=============  =====================================================================
code           message
=============  =====================================================================
wrong-type     ``lr must be float, got str ('fast')``
bad-choice     ``optimizer must be one of adamw, sgd, got 'adam'`` (+ did-you-mean)
bad-file-name  ``name='../x' cannot be a file name: '/' would make it a path``
out-of-range   ``steps must be positive, got 0`` / ``p must be between 0.0 and 1.0, got 1.5``
not-finite     ``lr must be a finite number, got .nan``
=============  =====================================================================

Integers are 64-bit everywhere (torch sizes and seeds are): a larger one is out of range.
Pure Python; no torch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from te_assembly.diagnostics import Diagnostic, did_you_mean, error
from te_assembly.files.names import name_problem

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

_BOUND_NAMES = {INT64_MAX: "2**63-1", 2**63: "2**63", INT64_MIN: "-2**63"}


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""Default of a field that has none: it must be given."""


@dataclass(frozen=True)
class FieldSpec:
    """One value a config may set: its type and what else it must satisfy."""

    type: type | tuple[type, ...]
    """``bool``, ``int``, ``float``, ``str`` or ``list`` (a tuple for either of several). A float field
    takes ints (YAML writes ``lr: 1``); an int field never takes a bool (``steps: true``)."""
    default: Any = REQUIRED
    doc: str = ""
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    """``minimum`` itself is not allowed (a learning rate must be > 0)."""
    nullable: bool = False
    finite: bool = True
    """Floats must not be NaN or infinite (``.nan``, ``.inf`` in YAML)."""
    pattern: str | None = None
    """A regular expression that also accepts a string outside ``choices`` (``cuda:\\d+``)."""
    pattern_doc: str = ""
    """How ``pattern`` is listed among the choices (``cuda:N``)."""
    items: FieldSpec | None = None
    """For a list field: what each item must be."""
    single_as_list: bool = False
    """A list field also takes one item on its own (``graph.formats=svg``)."""
    nonempty: bool = False
    """A string field must not be ``""``."""
    file_name: bool = False
    """A string that becomes one file or folder name (``import_hf.name``): the path sanitiser's rules
    (``files.names``: no separators, ``..``, control characters...)."""

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def type_name(self) -> str:
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        name = " | ".join(t.__name__ for t in types)
        if self.nonempty:
            name = f"a non-empty {name}"
        if self.items is not None:
            name = f"list of {self.items.type_name}"
        return f"{name} or null" if self.nullable else name

    @property
    def choices_text(self) -> str:
        shown = [show(c) if not isinstance(c, str) else c for c in self.choices or ()]
        if self.pattern_doc:
            shown.append(self.pattern_doc)
        if self.nullable:
            shown.append("null")
        return ", ".join(shown)

    def range_text(self) -> str:
        """The allowed range in words: ``positive``, ``>= 0``, ``between 0.0 and 1.0``."""
        low, high = self.minimum, self.maximum
        if high is None:
            if low is None:
                return "a 64-bit integer" if self.type is int else "a number"
            if (low == 0 and self.exclusive_minimum) or (low == 1 and self.type is int):
                return "positive"
            return f"> {_bound(low)}" if self.exclusive_minimum else f">= {_bound(low)}"
        if low is None:
            return f"<= {_bound(high)}"
        if self.exclusive_minimum:
            return f"> {_bound(low)} and <= {_bound(high)}"
        return f"between {_bound(low)} and {_bound(high)}"


def _bound(value: float | None) -> str:
    if isinstance(value, int) and value in _BOUND_NAMES:
        return _BOUND_NAMES[value]
    return str(value)


def show(value: Any) -> str:
    """A value as YAML would write it, shortened: messages quote what the user typed."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() > 256:  # also far below Python's int->str digit limit
            return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
        return str(value)
    if isinstance(value, str):
        text = repr(value)
        return text if len(text) <= 120 else text[:100] + "...'"
    text = repr(value)
    return text if len(text) <= 120 else text[:100] + "..."


def _got(value: Any) -> str:
    if value is None:
        return "null"
    return f"{type(value).__name__} ({show(value)})"


def _has_type(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in types  # YAML ``true`` is not a 1
    if isinstance(value, int) and float in types:
        return True
    return isinstance(value, types)


def check_value(spec: FieldSpec, value: Any, path: str, name: str | None = None) -> list[Diagnostic]:
    """Every way ``value`` (at key path ``path``) breaks ``spec``; ``name`` is how messages call it
    (the last key of the path by default)."""
    if _plainly_valid(spec, value):
        return []
    label = name or _last_key(path)
    if value is None:
        if spec.nullable:
            return []
        return [error(path, "wrong-type", f"{label} must be {spec.type_name}, got null")]
    if spec.items is not None:
        return _check_list(spec, value, path, label)
    types = spec.type if isinstance(spec.type, tuple) else (spec.type,)
    if not _has_type(value, types):
        return [error(path, "wrong-type", f"{label} must be {spec.type_name}, got {_got(value)}")]
    if spec.nonempty and value == "":
        return [error(path, "wrong-type", f"{label} must be {spec.type_name}, got ''")]
    if spec.file_name and isinstance(value, str) and name_problem(value) is not None:
        message = f"{label}={show(value)} cannot be a file name: {name_problem(value)}"
        return [error(path, "bad-file-name", message, "give a plain name: letters, digits, _ and -")]
    if isinstance(value, float) and spec.finite and not math.isfinite(value):
        return [error(path, "not-finite", f"{label} must be a finite number, got {show(value)}")]
    if spec.choices is not None and not _is_choice(spec, value):
        hint = did_you_mean(value, [str(c) for c in spec.choices]) if isinstance(value, str) else None
        message = f"{label} must be one of {spec.choices_text}, got {show(value)}"
        return [error(path, "bad-choice", message, hint)]
    if isinstance(value, (int, float)) and not isinstance(value, bool) and _out_of_range(spec, value):
        return [error(path, "out-of-range", f"{label} must be {_range_for(spec, value)}, got {show(value)}")]
    return []


def _plainly_valid(spec: FieldSpec, value: Any) -> bool:
    """The common case without building a message: an int, str or bool of the field's own type, in
    range, with no choices or pattern to look at (most of a 10,000-step model's values)."""
    kind = type(value)
    if kind is not spec.type or spec.choices is not None or spec.items is not None:
        return False
    if kind is int:
        low = INT64_MIN if spec.minimum is None else spec.minimum
        high = INT64_MAX if spec.maximum is None else spec.maximum
        return low < value <= high if spec.exclusive_minimum else low <= value <= high
    if kind is str:
        return not (spec.nonempty and value == "") and not spec.file_name
    return kind is bool


def _is_choice(spec: FieldSpec, value: Any) -> bool:
    assert spec.choices is not None
    if any(type(c) is type(value) and c == value for c in spec.choices):
        return True
    return (
        spec.pattern is not None and isinstance(value, str) and re.fullmatch(spec.pattern, value) is not None
    )


def _limits(spec: FieldSpec) -> tuple[float | None, float | None]:
    low, high = spec.minimum, spec.maximum
    if spec.type is int:
        low = INT64_MIN if low is None else low
        high = INT64_MAX if high is None else high
    return low, high


def _out_of_range(spec: FieldSpec, value: float) -> bool:
    low, high = _limits(spec)
    if low is not None and (value < low or (spec.exclusive_minimum and value == low)):
        return True
    return high is not None and value > high


def _range_for(spec: FieldSpec, value: float) -> str:
    if spec.maximum is None and isinstance(value, int) and value > INT64_MAX:
        return "at most 2**63-1 (a 64-bit integer)"
    if spec.minimum is None and isinstance(value, int) and value < INT64_MIN:
        return "at least -2**63 (a 64-bit integer)"
    return spec.range_text()


def _check_list(spec: FieldSpec, value: Any, path: str, label: str) -> list[Diagnostic]:
    assert spec.items is not None
    item_types = spec.items.type if isinstance(spec.items.type, tuple) else (spec.items.type,)
    if spec.single_as_list and not isinstance(value, (list, tuple)) and _has_type(value, item_types):
        return check_value(spec.items, value, path, label)
    if not isinstance(value, (list, tuple)):
        return [error(path, "wrong-type", f"{label} must be {spec.type_name}, got {_got(value)}")]
    if spec.nonempty and not value:
        return [
            error(path, "wrong-type", f"{label} must be a {spec.type_name} with at least one item, got []")
        ]
    out: list[Diagnostic] = []
    for i, item in enumerate(value):
        out.extend(check_value(spec.items, item, f"{path}[{i}]", label))
    return out


def _last_key(path: str) -> str:
    tail = re.split(r"[.\[]", path)[-1].rstrip("]")
    return tail or path


def spec_defaults(specs: Sequence[tuple[str, FieldSpec]]) -> dict[str, Any]:
    """``{name: default}`` for the specs that have one."""
    return {name: spec.default for name, spec in specs if not spec.required}


__all__ = ["INT64_MAX", "INT64_MIN", "REQUIRED", "FieldSpec", "check_value", "show", "spec_defaults"]
