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
    """Under ``parallel.shard``: the ``DeviceMesh`` ``fully_shard`` cuts every parameter over but the
    experts': the shard and expert ranks together (every one of them holds the same copy), ``(shard,)``
    or, with ``parallel.data``, ``(replicate, shard)`` for HSDP."""
    expert_device_mesh: Any = None
    """Under ``parallel.shard`` with ``parallel.expert``: the ``DeviceMesh`` of the ranks holding this
    rank's experts (same expert rank), over which ``fully_shard`` cuts the expert weights."""

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
    timeout = datetime.timedelta(seconds=settings.timeout_s)
    kwargs: dict[str, Any] = {"backend": backend, "timeout": timeout, **_attempt_store(timeout)}
    if device.type == "cuda":
        kwargs["device_id"] = device
    dist.init_process_group(**kwargs)
    return device


def _attempt_store(timeout: datetime.timedelta) -> dict[str, Any]:
    """Under torchrun's agent, the store of this attempt's workers only: a restarted worker group
    (``--max-restarts``) meets in the agent's store again, where the group it replaces left its ranks'
    addresses under the same keys, and gloo then connects to processes that are gone. The attempt's
    number (``TORCHELASTIC_RESTART_COUNT``) keeps each attempt's keys apart. ``{}`` elsewhere (``env://``)."""
    import os

    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    agent = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False, timeout=timeout
    )
    return {
        "store": dist.PrefixStore(f"te_assembly/attempt_{attempt}", agent),
        "rank": rank,
        "world_size": world,
    }


def build_mesh(settings: ParallelSettings, device: torch.device) -> Mesh:
    """Coordinates and subgroups of this rank; the default process group must exist."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world != settings.world_size:
        message = (
            f"{world} processes joined but the parallel sizes ({settings.describe()}) need "
            f"{settings.world_size}"
        )
        raise ConfigError([error("parallel", "parallel-world-size", message)])
    shard, expert, tensor = settings.shard, settings.expert, settings.tensor
    d, rest = divmod(rank, shard * expert * tensor)
    sr, rest = divmod(rest, expert * tensor)
    e, t = divmod(rest, tensor)
    tensor_group, expert_group, data_group, replica_group = _subgroups(settings, rank)
    device_mesh, expert_device_mesh = fsdp_meshes(settings, device) if settings.is_sharded else (None, None)
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
        expert_device_mesh,
    )


def _subgroups(settings: ParallelSettings, rank: int) -> tuple[Group, Group, Group, Group]:
    """This rank's tensor, expert, data and replica groups (None where it is alone). Every rank creates
    every group, in the same order (``dist.new_group`` is collective)."""
    data, shard, expert, tensor = settings.data, settings.shard, settings.expert, settings.tensor
    timeout = datetime.timedelta(seconds=settings.timeout_s)

    def at(d: int, e: int, t: int, s: int = 0) -> int:
        return ((d * shard + s) * expert + e) * tensor + t

    def groups(members: list[list[int]]) -> Group:
        mine = None
        for ranks in members:
            if len(ranks) == 1:
                continue
            group = dist.new_group(ranks, timeout=timeout)
            if rank in ranks:
                mine = group
        return mine

    # A shard rank is one more data-parallel coordinate for every group but FSDP2's own meshes.
    replicas = [(a, z) for a in range(data) for z in range(shard)]
    every_data = [(a, z) for a in range(data) for z in range(shard)]
    tensor_group = groups(
        [[at(a, b, c, z) for c in range(tensor)] for a, z in replicas for b in range(expert)]
    )
    expert_group = groups(
        [[at(a, b, c, z) for b in range(expert)] for a, z in replicas for c in range(tensor)]
    )
    data_group = groups(
        [[at(a, b, c, z) for a, z in every_data] for b in range(expert) for c in range(tensor)]
    )
    replica_group = groups(
        [[at(a, b, c, z) for a, z in every_data for b in range(expert)] for c in range(tensor)]
    )
    return tensor_group, expert_group, data_group, replica_group


def fsdp_meshes(settings: ParallelSettings, device: torch.device) -> tuple[Any, Any]:
    """FSDP2's meshes (every rank builds both, in the same order): one over which the weights every
    rank holds alike are cut, ``(replicate=data, shard=shard x expert)``; and, with ``parallel.expert``,
    one over the ranks of this rank's expert slice, ``(replicate=data, shard=shard)``. A mesh with
    ``data == 1`` drops its replicate dimension. ``tensor`` is 1 here (``settings.py``)."""
    from torch.distributed.device_mesh import DeviceMesh

    data, shard, expert = settings.data, settings.shard, settings.expert
    ranks = torch.arange(settings.world_size).reshape(data, shard, expert)  # the rank order above

    def over(members: torch.Tensor, leading: tuple[str, ...] = ()) -> Any:
        """A mesh of ``members`` whose last two dims are (replicate, shard), cut to this rank's part."""
        names = (*leading, "replicate", "shard")
        if data == 1:
            members, names = members.squeeze(-2), (*leading, "shard")
        built = DeviceMesh(device.type, members, mesh_dim_names=names)
        return built[names[len(leading) :]] if leading else built

    dense = over(ranks.reshape(data, shard * expert))
    if expert == 1:
        return dense, None
    return dense, over(ranks.permute(2, 0, 1), leading=("expert",))


def group_size(group: Group) -> int:
    return 1 if group is None else dist.get_world_size(group)


def group_rank(group: Group) -> int:
    return 0 if group is None else dist.get_rank(group)


__all__ = [
    "Group",
    "Mesh",
    "build_mesh",
    "fsdp_meshes",
    "group_rank",
    "group_size",
    "init_default_group",
    "resolve_backend",
]
