"""The ``parallel:`` config section as a checked dataclass. Pure Python: no torch import.

World size = ``data * shard * tensor * expert`` processes. Ranks are laid out tensor-fastest:
``rank = ((data_rank * shard + shard_rank) * expert + expert_rank) * tensor + tensor_rank``, so the ranks
of one tensor-parallel group are neighbours (one machine, NVLink) as Megatron-LM places them, and so are
the ranks of one FSDP2 shard group (HSDP shards within a machine and replicates across machines).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from te_assembly.diagnostics import error
from te_assembly.errors import ConfigError
from te_assembly.sections import read_section, setting

BACKENDS = ("auto", "gloo", "nccl")
SIZES = ("data", "shard", "tensor", "sequence", "expert")
MAX_TIMEOUT_S = 10**9
"""Longer is no timeout at all (and beyond about 8.6e13 s Python's ``timedelta`` overflows)."""


TE_SHARDED_EXPERTS = (
    "parallel.shard with parallel.expert on the TE engine: each step holding experts must be an FSDP2 unit "
    "of its own (its weights are cut over other ranks than the rest), and TE's fusers run their ops "
    "without calling them as modules, so FSDP2 cannot gather them"
)
"""Why the TE engine refuses FSDP2 with expert parallelism (the config check and the engine say it)."""
TE_SHARDED_EXPERTS_HINT = (
    "use engine=reference for a sharded expert-parallel run, or parallel.data with parallel.expert on the "
    "TE engine"
)


@dataclass(frozen=True)
class ParallelSettings:
    """``parallel:``: how ``torchrun``'s processes split the model (README: "Parallel runs")."""

    data: int = setting(
        1,
        minimum=1,
        doc="data-parallel replicas (DistributedDataParallel): each reads its own rows; gradients averaged",
    )
    shard: int = setting(
        1,
        minimum=1,
        doc="FSDP2 ranks (torch fully_shard): parameters, gradients and optimizer state cut across them, "
        "each reads its own rows; with data > 1, HSDP (shard within a group, replicate across groups); "
        "with expert > 1, expert weights cut across the shard ranks of their expert rank",
    )
    tensor: int = setting(
        1, minimum=1, doc="tensor-parallel ranks: Linear steps marked tensor_parallel_mode column/row split"
    )
    sequence: int = setting(
        1,
        minimum=1,
        doc="1, or = tensor: token rows outside tensor-parallel regions split across those ranks (TE's "
        "sequence_parallel); adds no processes",
    )
    expert: int = setting(
        1,
        minimum=1,
        doc="expert-parallel ranks: experts / expert per rank, dispatched rows exchanged "
        "(all_to_all_single); each reads its own rows",
    )
    backend: str = setting("auto", choices=BACKENDS, doc="auto: NCCL on CUDA devices, gloo on CPU")
    timeout_s: float = setting(
        300.0,
        minimum=0,
        exclusive_minimum=True,
        maximum=MAX_TIMEOUT_S,
        doc="a collective (or the start-up rendezvous) waiting longer fails the job instead of hanging",
    )
    fail_on_rank: int | None = setting(
        None, minimum=0, doc="testing aid: this rank raises at its first forward (the job must exit non-zero)"
    )

    def __post_init__(self) -> None:
        if self.sequence not in (1, self.tensor):
            raise ConfigError(
                [
                    error(
                        "parallel.sequence",
                        "conflicting-settings",
                        f"parallel.sequence={self.sequence} but parallel.tensor={self.tensor}: sequence "
                        "parallelism splits token rows across the tensor-parallel ranks, so it is 1 (off) or "
                        "equal to parallel.tensor",
                        f"set parallel.tensor={self.sequence} too, or parallel.sequence=1",
                    )
                ]
            )
        if self.shard > 1 and self.tensor > 1:
            raise ConfigError(
                [
                    error(
                        "parallel.shard",
                        "conflicting-settings",
                        f"parallel.shard={self.shard} with parallel.tensor={self.tensor}: tensor parallelism "
                        "cuts each weight inside itself by hand (plain tensors, not the DTensors that "
                        "fully_shard would need to cut a slice again and a checkpoint to place it), so the "
                        "two cannot be combined yet",
                        "use parallel.shard with parallel.data (HSDP) and parallel.expert, or "
                        "parallel.tensor without parallel.shard",
                    )
                ]
            )
        if self.fail_on_rank is not None and self.fail_on_rank >= self.world_size:
            raise ConfigError(
                [
                    error(
                        "parallel.fail_on_rank",
                        "conflicting-settings",
                        f"fail_on_rank={self.fail_on_rank} but the layout has only {self.world_size} rank(s)",
                    )
                ]
            )

    @property
    def world_size(self) -> int:
        return self.data * self.shard * self.tensor * self.expert

    @property
    def is_sharded(self) -> bool:
        """FSDP2: parameters, gradients and optimizer state are cut across ``shard`` ranks."""
        return self.shard > 1

    @property
    def sequence_parallel(self) -> bool:
        return self.sequence > 1

    @property
    def data_shards(self) -> int:
        """How many ranks read distinct rows of a batch: data, shard and expert ranks (tensor-parallel
        ranks share theirs, or split it further under sequence parallelism)."""
        return self.data * self.shard * self.expert

    @property
    def row_shards(self) -> int:
        """Into how many pieces a batch's rows are cut (``data_shards``, times ``tensor`` under sequence
        parallelism)."""
        return self.data_shards * (self.sequence if self.sequence_parallel else 1)

    @property
    def is_parallel(self) -> bool:
        return self.world_size > 1

    def describe(self) -> str:
        names = ("data", "shard", "tensor", "expert") if self.is_sharded else ("data", "tensor", "expert")
        sizes = " x ".join(f"{name} {getattr(self, name)}" for name in names)
        seq = ", sequence parallel" if self.sequence_parallel else ""
        return f"{sizes} = {self.world_size} process(es){seq}"

    def sizes(self) -> dict[str, int]:
        return {name: int(getattr(self, name)) for name in SIZES}

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], prefix: str = "parallel") -> ParallelSettings:
        """Check every key at once; raise ``ConfigError`` listing all problems."""
        return read_section(cls, raw, prefix)


__all__ = ["BACKENDS", "SIZES", "TE_SHARDED_EXPERTS", "TE_SHARDED_EXPERTS_HINT", "ParallelSettings"]
