"""What ``torchrun`` tells each process. Pure Python: no torch import.

``torchrun --nproc_per_node=N -m te_assembly ...`` starts N processes and sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` in each; ``torch.distributed`` reads them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Launch:
    rank: int
    world_size: int
    local_rank: int
    under_torchrun: bool

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def tag(self) -> str:
        """``[rank 1/2] `` under torchrun (every line a rank prints says who it is), else empty."""
        return f"[rank {self.rank}/{self.world_size}] " if self.under_torchrun else ""


def current_launch(env: Mapping[str, str] | None = None) -> Launch:
    """This process's place in the job from torchrun's environment; a single process when unset."""
    env = os.environ if env is None else env
    if "WORLD_SIZE" not in env or "RANK" not in env:
        return Launch(0, 1, 0, under_torchrun=False)
    return Launch(
        int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", env["RANK"])), under_torchrun=True
    )


REPORT_GRACE_S = 10.0
"""How long a rank other than 0 that failed on the config waits before it exits (see
``let_main_rank_report``)."""


def let_main_rank_report(launch: Launch | None = None, grace_s: float = REPORT_GRACE_S) -> None:
    """Under torchrun, before a rank other than 0 exits on a config error: wait until torchrun stops it.

    Every rank reads the same config and finds the same errors; rank 0 alone prints them. torchrun stops
    every rank as soon as the first one exits, so a rank that exits before rank 0 has printed would
    silence the report. Rank 0's own exit ends the wait (torchrun stops this rank); ``grace_s`` bounds
    it should rank 0 not fail at all."""
    launch = current_launch() if launch is None else launch
    if launch.under_torchrun and not launch.is_main:
        import time

        time.sleep(grace_s)


def torchrun_command(world_size: int, command: str = "run") -> str:
    return f"torchrun --nproc_per_node={world_size} -m te_assembly {command} ..."


__all__ = [
    "REPORT_GRACE_S",
    "Launch",
    "current_launch",
    "let_main_rank_report",
    "torchrun_command",
]
