"""A config section (``train:``, ``bench:``) read into its settings dataclass, every problem at once."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from te_assembly.diagnostics import Diagnostic, did_you_mean, error
from te_assembly.errors import ConfigError

T = TypeVar("T")


def read_section(
    cls: type[T], raw: Mapping[str, Any], prefix: str, problem: Callable[[str, Any], str | None]
) -> T:
    """``cls(**raw)`` after checking every key: unknown keys (with a suggestion) and each value's
    ``problem(key, value)``; raises ``ConfigError`` listing them all. Ints given for float fields are
    widened (YAML writes ``lr: 1`` as an int)."""
    assert dataclasses.is_dataclass(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    diags: list[Diagnostic] = []
    values: dict[str, Any] = {}
    for key, value in raw.items():
        path = f"{prefix}.{key}"
        if key not in fields:
            hint = did_you_mean(key, fields)
            diags.append(error(path, "unknown-key", f"unknown {prefix} setting {key!r}", hint))
        elif (message := problem(key, value)) is not None:
            diags.append(error(path, f"bad-{prefix}-value", message))
        else:
            is_float = isinstance(fields[key].default, float)
            values[key] = float(value) if is_float and value is not None else value
    if diags:
        raise ConfigError(diags)
    return cls(**values)
