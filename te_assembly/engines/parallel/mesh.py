"""This rank's coordinates and process groups. Every rank creates every group, in the same order, as
``torch.distributed.new_group`` requires; a group of one rank is None (nothing to communicate)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from te_assembly.analysis.parallel.settings import ParallelSettings
from te_assembly.diagnostics import error
from te_assembly.errors import ConfigError

Group = Any
"""A ``torch.distributed.ProcessGroup``, or None for a group of one rank."""


@dataclass(frozen=True)
class Mesh:
    settings: ParallelSettings
    rank: int
    data_rank: int
    shard_rank: int
    expert_rank: int
    tensor_rank: int
    tensor_group: Group
    """Same data and expert rank: the ranks that split weights of tensor-parallel Linears."""
    expert_group: Group
    """Same data and tensor rank: the ranks that split the experts and exchange dispatched rows."""
    data_group: Group
    """Same expert and tensor rank: replicas of the same expert slice."""
    replica_group: Group
    """Same tensor rank: every replica of the non-expert weights (data x shard x expert ranks); DDP
    averages their gradients (FSDP2 does under ``parallel.shard``)."""
    backend: str
    device: torch.device
    device_mesh: Any = None
    """Under ``parallel.shard``: the ``DeviceMesh`` ``fully_shard`` cuts over, ``(shard,)`` or, with
    ``parallel.data``, ``(replicate, shard)`` for HSDP."""

    @property
    def world_size(self) -> int:
        return self.settings.world_size

    @property
    def shard_index(self) -> int:
        """Which of the ``data * shard * expert`` row shards of a batch this rank reads."""
        s = self.settings
        return (self.data_rank * s.shard + self.shard_rank) * s.expert + self.expert_rank

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_backend(settings: ParallelSettings, device: torch.device) -> str:
    if settings.backend == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if settings.backend == "nccl" and device.type != "cuda":
        raise ConfigError(
            [
                error(
                    "parallel.backend",
                    "conflicting-settings",
                    f"backend nccl needs CUDA devices, but device is {device}",
                    "use parallel.backend=gloo (or auto) on CPU",
                )
            ]
        )
    return settings.backend


def init_default_group(settings: ParallelSettings, device: torch.device, local_rank: int) -> torch.device:
    """``init_process_group`` from torchrun's environment, with the collective timeout; returns this
    rank's device (``cuda:<local rank>`` on GPUs)."""
    backend = resolve_backend(settings, device)
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    kwargs: dict[str, Any] = {"backend": backend, "timeout": datetime.timedelta(seconds=settings.timeout_s)}
    if device.type == "cuda":
        kwargs["device_id"] = device
    dist.init_process_group(**kwargs)
    return device


def build_mesh(settings: ParallelSettings, device: torch.device) -> Mesh:
    """Coordinates and subgroups of this rank; the default process group must exist."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world != settings.world_size:
        raise ConfigError(
            [
                error(
                    "parallel",
                    "parallel-world-size",
                    f"{world} processes joined but the parallel sizes ({settings.describe()}) need "
                    f"{settings.world_size}",
                )
            ]
        )
    data, shard, expert, tensor = settings.data, settings.shard, settings.expert, settings.tensor

    def at(d: int, e: int, t: int, s: int = 0) -> int:
        return ((d * shard + s) * expert + e) * tensor + t

    d, rest = divmod(rank, shard * expert * tensor)
    sr, rest = divmod(rest, expert * tensor)
    e, t = divmod(rest, tensor)
    timeout = datetime.timedelta(seconds=settings.timeout_s)

    def groups(members: list[list[int]]) -> Group:
        mine = None
        for ranks in members:
            if len(ranks) == 1:
                continue
            group = dist.new_group(ranks, timeout=timeout)
            if rank in ranks:
                mine = group
        return mine

    # Shard ranks (only with tensor = expert = 1, settings.py) join the data-parallel groups.
    tensor_group = groups([[at(a, b, c) for c in range(tensor)] for a in range(data) for b in range(expert)])
    expert_group = groups([[at(a, b, c) for b in range(expert)] for a in range(data) for c in range(tensor)])
    data_group = groups(
        [
            [at(a, b, c, z) for a in range(data) for z in range(shard)]
            for b in range(expert)
            for c in range(tensor)
        ]
    )
    replica_group = groups(
        [
            [at(a, b, c, z) for a in range(data) for z in range(shard) for b in range(expert)]
            for c in range(tensor)
        ]
    )
    device_mesh = None
    if settings.is_sharded:
        from torch.distributed.device_mesh import init_device_mesh

        shape, names = ((shard,), ("shard",)) if data == 1 else ((data, shard), ("replicate", "shard"))
        device_mesh = init_device_mesh(device.type, shape, mesh_dim_names=names)
    return Mesh(
        settings,
        rank,
        d,
        sr,
        e,
        t,
        tensor_group,
        expert_group,
        data_group,
        replica_group,
        dist.get_backend(),
        device,
        device_mesh,
    )


def group_size(group: Group) -> int:
    return 1 if group is None else dist.get_world_size(group)


def group_rank(group: Group) -> int:
    return 0 if group is None else dist.get_rank(group)


__all__ = ["Group", "Mesh", "build_mesh", "group_rank", "group_size", "init_default_group", "resolve_backend"]
