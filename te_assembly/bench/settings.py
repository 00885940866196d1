"""The ``bench:`` config block as a checked dataclass."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from te_assembly.diagnostics import Diagnostic, did_you_mean, error
from te_assembly.errors import ConfigError


@dataclass(frozen=True)
class BenchSettings:
    tokens: int = 1024
    warmup: int = 3
    repeats: int = 10
    optimizer: str = "adamw"
    lr: float = 1e-3
    compare: bool = False
    split_at: str | None = None
    threads: int | None = None

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], prefix: str = "bench") -> BenchSettings:
        names = {f.name for f in dataclasses.fields(cls)}
        diags: list[Diagnostic] = []
        for key, value in raw.items():
            path = f"{prefix}.{key}"
            if key not in names:
                diags.append(
                    error(path, "unknown-key", f"unknown {prefix} setting {key!r}", did_you_mean(key, names))
                )
            elif (problem := _problem(key, value)) is not None:
                diags.append(error(path, "bad-bench-value", problem))
        if diags:
            raise ConfigError(diags)
        values: dict[str, Any] = {k: (float(v) if k == "lr" else v) for k, v in raw.items()}
        return cls(**values)


def _problem(key: str, value: Any) -> str | None:
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if key in ("tokens", "repeats"):
        return None if is_int and value >= 1 else f"{key} must be a positive integer, got {value!r}"
    if key == "warmup":
        return None if is_int and value >= 0 else f"warmup must be a non-negative integer, got {value!r}"
    if key == "optimizer":
        return None if value in ("adamw", "sgd") else f"optimizer must be adamw or sgd, got {value!r}"
    if key == "lr":
        ok = (is_int or isinstance(value, float)) and value > 0
        return None if ok else f"lr must be a positive number, got {value!r}"
    if key == "compare":
        return None if isinstance(value, bool) else f"compare must be true or false, got {value!r}"
    if key == "threads":
        # More threads than cores only adds contention to the timings (and torch takes a C int).
        cores = os.cpu_count() or 1
        return (
            None
            if value is None or (is_int and 1 <= value <= cores)
            else f"threads must be null or 1..{cores} (the CPU cores here), got {value!r}"
        )
    if key == "split_at":
        return None if value is None or isinstance(value, str) else "split_at must be a step name or null"
    return None
