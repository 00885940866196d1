"""One module per command. Each exposes ``SECTIONS`` (the settings sections it reads, checked by the
analysis with the model and recipe) and ``main(analysis, console) -> exit code or Outcome``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Outcome:
    """What a command's run came to: its exit code, and the numbers a sweep's summary table shows."""

    code: int
    summary: dict[str, Any] = field(default_factory=dict)
