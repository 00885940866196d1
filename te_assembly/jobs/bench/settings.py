"""The ``bench:`` config block as a checked dataclass (schema: each field's ``setting(...)``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from te_assembly.jobs.train.settings import OPTIMIZERS
from te_assembly.sections import read_section, setting

# More threads than cores only adds contention to the timings (and torch takes a C int).
_CORES = os.cpu_count() or 1


@dataclass(frozen=True)
class BenchSettings:
    """``bench:``: what is timed (rows, sequence length), how often, with which optimizer, which variants."""

    tokens: int = setting(1024, minimum=1, doc="rows of x per call")
    seq_len: int = setting(
        32, minimum=1, doc="positions per sequence when the model takes x as [batch, seq, features]"
    )
    warmup: int = setting(3, minimum=0, doc="untimed repeats per phase")
    repeats: int = setting(10, minimum=1, doc="timed repeats per phase")
    optimizer: str = setting("adamw", choices=OPTIMIZERS, doc="optimizer of the full-step phase")
    lr: float = setting(1e-3, minimum=0, exclusive_minimum=True, doc="its learning rate")
    compare: bool = setting(
        False, doc="also time the block split into fusers with public tensors, and plain PyTorch, interleaved"
    )
    split_at: str | None = setting(
        None,
        doc="step name the split variant cuts before (null: the midpoint, or where rerouted channels cross)",
    )
    threads: int | None = setting(
        None,
        minimum=1,
        maximum=_CORES,
        doc="torch.set_num_threads for CPU runs (null: torch's default); 1 steadies a busy machine",
    )
    report: str | None = setting(
        None, nonempty=True, doc="write the results as JSON to this path (rank 0 under torchrun)"
    )

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], prefix: str = "bench") -> BenchSettings:
        return read_section(cls, raw, prefix)
