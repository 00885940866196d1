"""The ``parallel:`` config section as a checked dataclass. Pure Python: no torch import.

World size = ``data * tensor * expert`` processes. Ranks are laid out tensor-fastest:
``rank = (data_rank * expert + expert_rank) * tensor + tensor_rank``, so the ranks of one tensor-parallel
group are neighbours (one machine, NVLink) as Megatron-LM places them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from te_assembly.diagnostics import error
from te_assembly.errors import ConfigError
from te_assembly.sections import read_section

BACKENDS = ("auto", "gloo", "nccl")
SIZES = ("data", "tensor", "sequence", "expert")


@dataclass(frozen=True)
class ParallelSettings:
    data: int = 1
    """Data-parallel replicas: each reads its own rows of the batch; gradients are averaged
    (``DistributedDataParallel``)."""
    tensor: int = 1
    """Tensor-parallel ranks: Linear steps marked ``tensor_parallel_mode: column|row`` split their weights."""
    sequence: int = 1
    """1, or equal to ``tensor``: sequence parallelism (TE's ``sequence_parallel``) splits the token rows
    outside the tensor-parallel regions across the tensor-parallel ranks. It adds no processes."""
    expert: int = 1
    """Expert-parallel ranks: each holds ``experts / expert`` of every expert layer and its own rows of the
    batch; dispatched rows travel to their expert's rank and back (``all_to_all_single``)."""
    backend: str = "auto"
    """``auto``: NCCL on CUDA devices, gloo on CPU."""
    timeout_s: float = 300.0
    """A collective (or the start-up rendezvous) that waits longer fails the job instead of hanging."""
    fail_on_rank: int | None = None
    """Testing aid: this rank raises at its first forward pass (the job must exit non-zero, never hang)."""

    def __post_init__(self) -> None:
        if self.sequence not in (1, self.tensor):
            raise ConfigError(
                [
                    error(
                        "parallel.sequence",
                        "bad-parallel-value",
                        f"parallel.sequence={self.sequence} but parallel.tensor={self.tensor}: sequence "
                        "parallelism splits token rows across the tensor-parallel ranks, so it is 1 (off) or "
                        "equal to parallel.tensor",
                        f"set parallel.tensor={self.sequence} too, or parallel.sequence=1",
                    )
                ]
            )
        if self.fail_on_rank is not None and self.fail_on_rank >= self.world_size:
            raise ConfigError(
                [
                    error(
                        "parallel.fail_on_rank",
                        "bad-parallel-value",
                        f"fail_on_rank={self.fail_on_rank} but the layout has only {self.world_size} rank(s)",
                    )
                ]
            )

    @property
    def world_size(self) -> int:
        return self.data * self.tensor * self.expert

    @property
    def sequence_parallel(self) -> bool:
        return self.sequence > 1

    @property
    def data_shards(self) -> int:
        """How many ranks read distinct rows of a batch: data and expert ranks (tensor-parallel ranks
        share theirs, or split it further under sequence parallelism)."""
        return self.data * self.expert

    @property
    def row_shards(self) -> int:
        """Into how many pieces a batch's rows are cut (``data_shards``, times ``tensor`` under sequence
        parallelism)."""
        return self.data_shards * (self.sequence if self.sequence_parallel else 1)

    @property
    def is_parallel(self) -> bool:
        return self.world_size > 1

    def describe(self) -> str:
        sizes = " x ".join(f"{name} {getattr(self, name)}" for name in ("data", "tensor", "expert"))
        seq = ", sequence parallel" if self.sequence_parallel else ""
        return f"{sizes} = {self.world_size} process(es){seq}"

    def sizes(self) -> dict[str, int]:
        return {name: int(getattr(self, name)) for name in SIZES}

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], prefix: str = "parallel") -> ParallelSettings:
        """Check every key at once; raise ``ConfigError`` listing all problems."""
        return read_section(cls, raw, prefix, _problem)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _problem(key: str, value: Any) -> str | None:
    if key in SIZES:
        return None if _is_int(value) and value >= 1 else f"{key} must be a positive integer, got {value!r}"
    if key == "backend":
        return None if value in BACKENDS else f"backend must be one of {', '.join(BACKENDS)}, got {value!r}"
    if key == "timeout_s":
        ok = (_is_int(value) or isinstance(value, float)) and value > 0 and value == value and value < 1e9
        return None if ok else f"timeout_s must be a positive number of seconds, got {value!r}"
    if key == "fail_on_rank":
        ok = value is None or (_is_int(value) and value >= 0)
        return None if ok else f"fail_on_rank must be null or a rank >= 0, got {value!r}"
    return None


__all__ = ["BACKENDS", "SIZES", "ParallelSettings"]
