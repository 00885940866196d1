"""What a config's sidecar file says its checks must find: ``NAME.expect.yaml`` beside ``NAME.yaml``.

    # model/my_bad_model.expect.yaml
    diagnostics:                  # exactly these, errors and warnings alike; any other fails the test
      - {code: dangling-input, path: model.ops[4].extra_inputs.split_sizes}
      - {code: shadowed-config, path: model, severity: warning}
    overrides:                    # optional: one test per set ([] is the config as written)
      - []
      - [model.dims.layers=1, recipe=fp8_delayed]
    model:                        # blocks only: the minimal model that uses the block
      in_features: 64
      input_layout: sequence

A config without a sidecar must validate with no error (its warnings are shown, never fail it). Pure
Python: read with the same YAML reader as every config (line numbers, hostile-file limits).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from te_assembly.config.source import read_file
from te_assembly.diagnostics import Diagnostic
from te_assembly.errors import SidecarError

SUFFIX = ".expect.yaml"
SEVERITIES = ("error", "warning")
_KEYS = ("diagnostics", "overrides", "model")
_MODEL_KEYS = ("in_features", "input_layout", "dims")


@dataclass(frozen=True)
class Expected:
    """One diagnostic a check must report: its rule ``code``, its key ``path`` and its ``severity``."""

    code: str
    path: str
    severity: str = "error"

    def matches(self, d: Diagnostic) -> bool:
        return (d.code, d.path, d.severity.value) == (self.code, self.path, self.severity)

    def describe(self) -> str:
        return f"{self.severity} {self.code} at {self.path}"

    @classmethod
    def of(cls, entry: Expected | Mapping[str, Any]) -> Expected:
        if isinstance(entry, Expected):
            return entry
        unknown = sorted(set(entry) - {"code", "path", "severity"})
        if unknown or not isinstance(entry.get("code"), str) or not isinstance(entry.get("path"), str):
            raise ValueError(
                "an expected diagnostic is a mapping of code, path and (optionally) severity; "
                f"got {dict(entry)!r}"
            )
        severity = entry.get("severity", "error")
        if severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {', '.join(SEVERITIES)}; got {severity!r}")
        return cls(entry["code"], entry["path"], severity)


@dataclass(frozen=True)
class Sidecar:
    path: Path | None
    diagnostics: tuple[Expected, ...] | None = None
    """None: no expectation (the config must be valid); a tuple: exactly these."""
    overrides: tuple[tuple[str, ...], ...] | None = None
    """None: the override sets of the ini option (or just the config as written)."""
    model: dict[str, Any] = field(default_factory=dict)

    @property
    def expects_errors(self) -> bool:
        return self.diagnostics is not None and any(e.severity == "error" for e in self.diagnostics)


def sidecar_of(config: Path) -> Path:
    return config.with_name(config.name.removesuffix(".yaml") + SUFFIX)


def is_sidecar(path: Path) -> bool:
    return path.name.endswith(SUFFIX)


def _fail(path: Path, where: str, what: str) -> SidecarError:
    return SidecarError(f"{path}: {where}: {what}")


def override_sets(value: Any, path: Path, where: str) -> tuple[tuple[str, ...], ...]:
    """A list of override sets, each a list of ``key=value`` strings (or one string of them)."""
    if not isinstance(value, list) or not value:
        raise _fail(path, where, "a non-empty list of override sets (each a list of key=value)")
    out = []
    for i, entry in enumerate(value):
        items = entry.split() if isinstance(entry, str) else entry
        if not isinstance(items, list) or not all(isinstance(o, str) for o in items):
            raise _fail(path, f"{where}[{i}]", f"a list of key=value strings; got {entry!r}")
        out.append(tuple(items))
    return tuple(out)


def read_sidecar(config: Path) -> Sidecar:
    """The sidecar of ``config`` (an empty one when there is none); ``SidecarError`` for a bad one."""
    path = sidecar_of(config)
    if not path.is_file():
        return Sidecar(None)
    source = read_file(str(path), "expect", "")
    if not source.ok:
        raise SidecarError("; ".join(d.format() for d in source.diagnostics))
    data = source.data if source.data is not None else {}
    if not isinstance(data, dict):
        raise _fail(path, "top level", f"a mapping with {', '.join(_KEYS)}")
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise _fail(path, unknown[0], f"unknown key; a sidecar holds {', '.join(_KEYS)}")
    expected = None
    if "diagnostics" in data:
        entries = data["diagnostics"] if data["diagnostics"] is not None else []
        if not isinstance(entries, list):
            raise _fail(path, "diagnostics", "a list of {code, path, severity}")
        try:
            expected = tuple(
                Expected.of(e) if isinstance(e, dict) else Expected.of({"bad": e}) for e in entries
            )
        except ValueError as exc:
            raise _fail(path, "diagnostics", str(exc)) from None
    overrides = override_sets(data["overrides"], path, "overrides") if "overrides" in data else None
    model = data.get("model") or {}
    if not isinstance(model, dict) or set(model) - set(_MODEL_KEYS):
        raise _fail(path, "model", f"a mapping of {', '.join(_MODEL_KEYS)} (the block's minimal model)")
    return Sidecar(path, expected, overrides, dict(model))


def compare(
    expected: Iterable[Expected], found: Sequence[Diagnostic]
) -> tuple[list[Expected], list[Diagnostic]]:
    """What was expected and not reported, and what was reported and not expected (each expectation
    matches one diagnostic)."""
    left = list(found)
    missing = []
    for e in expected:
        hit = next((d for d in left if e.matches(d)), None)
        if hit is None:
            missing.append(e)
        else:
            left.remove(hit)
    return missing, left


__all__ = [
    "SUFFIX",
    "Expected",
    "Sidecar",
    "SidecarError",
    "compare",
    "is_sidecar",
    "override_sets",
    "read_sidecar",
    "sidecar_of",
]
