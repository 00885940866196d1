"""The ``bench:`` config block as a checked dataclass."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from te_assembly.sections import read_section
from te_assembly.train.settings import OPTIMIZERS


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
    report: str | None = None
    """A path to write the results to as JSON (for scripts), or None."""

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], prefix: str = "bench") -> BenchSettings:
        return read_section(cls, raw, prefix, _problem)


def _problem(key: str, value: Any) -> str | None:
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if key in ("tokens", "repeats"):
        return None if is_int and value >= 1 else f"{key} must be a positive integer, got {value!r}"
    if key == "warmup":
        return None if is_int and value >= 0 else f"warmup must be a non-negative integer, got {value!r}"
    if key == "optimizer":
        allowed = " or ".join(OPTIMIZERS)
        return None if value in OPTIMIZERS else f"optimizer must be {allowed}, got {value!r}"
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
    if key == "report":
        return (
            None
            if value is None or (isinstance(value, str) and value)
            else "report must be a file path or null"
        )
    if key == "split_at":
        return None if value is None or isinstance(value, str) else "split_at must be a step name or null"
    return None
