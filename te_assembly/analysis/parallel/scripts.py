"""The ``launch:`` section and the scripts ``launch`` writes from it: an sbatch file for Slurm, a task
YAML for SkyPilot, or the torchrun line of each node. Pure Python: no torch import.

Every script runs the same command on every node: ``torchrun`` with a c10d rendezvous on the first node
(``--max-restarts`` restarts a node's workers when one dies) around ``python -m te_assembly <job> ...``
with the user's overrides and ``train.resume=auto``, so a restart, a requeue after preemption and the
first start are one command (``docs/guides/multi-node.md``).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from te_assembly.catalog.devices import ACCELERATORS
from te_assembly.sections import read_section, setting

SCHEDULERS = ("slurm", "skypilot", "torchrun")
JOBS = ("train", "bench", "run")
SKYPILOT_ACCELERATORS = {
    "a100": "A100-80GB",
    "l40s": "L40S",
    "h100": "H100",
    "h200": "H200",
    "b200": "B200",
    "gb200": "GB200",
}
"""``launch.accelerator`` as SkyPilot names it (``sky show-gpus``)."""


@dataclass(frozen=True)
class LaunchSettings:
    """``launch:``: where a parallel job runs and how it is started."""

    nodes: int = setting(1, minimum=1, doc="machines")
    gpus_per_node: int = setting(8, minimum=1, doc="processes (one per GPU) on each machine")
    scheduler: str = setting(
        "slurm",
        choices=SCHEDULERS,
        doc="slurm: an sbatch file; skypilot: a SkyPilot task YAML; torchrun: the torchrun line of each node",
    )
    job: str = setting("train", choices=JOBS, doc="the te_assembly command every rank runs")
    accelerator: str | None = setting(
        "h100",
        choices=(*ACCELERATORS, None),
        doc="each GPU (catalog/devices.py: a100, l40s, h100, h200, b200, gb200): the memory per rank is "
        "checked against it, and SkyPilot asks for it; null: no memory check",
    )
    name: str = setting(
        "te_assembly", file_name=True, doc="the job's name: its script's file name and train's run folder"
    )
    max_restarts: int = setting(3, minimum=0, doc="torchrun --max-restarts: worker failures survived")
    port: int = setting(29500, minimum=1, maximum=65535, doc="the rendezvous port on the first node")
    head: str = setting(
        "$HEAD_NODE_ADDR",
        doc="torchrun scheduler: the first node's address in every node's line (a shell variable by default)",
    )
    time: str | None = setting(None, doc="slurm: #SBATCH --time (null: the partition's default)")
    partition: str | None = setting(None, doc="slurm: #SBATCH --partition")
    account: str | None = setting(None, doc="slurm: #SBATCH --account")
    requeue_before_s: int = setting(
        300,
        minimum=0,
        doc="slurm: this long before the time limit the job requeues itself; every rank checkpoints and a "
        "requeued job resumes (0: never)",
    )
    spot: bool = setting(False, doc="skypilot: spot instances (a preempted job recovers and resumes)")
    setup: str = setting(
        "pip install 'te_assembly[te]'", doc="skypilot: the shell commands that install te_assembly on a node"
    )

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], prefix: str = "launch") -> LaunchSettings:
        return read_section(cls, raw, prefix)


@dataclass(frozen=True)
class Script:
    """What ``launch`` writes: the file's name, its text, and the command that submits it (given the
    file's path), or what to do with it in words."""

    file: str
    text: str
    submit: str


def job_arguments(job: str, overrides: Sequence[str], config_dirs: Sequence[str], name: str) -> list[str]:
    """``python -m te_assembly`` arguments every rank runs: the job, ``-cd`` for each config folder, the
    user's overrides but ``launch.*``, and for ``train`` a fixed run folder resumed automatically."""
    kept = [o for o in overrides if not o.lstrip("+~").startswith("launch.")]
    extra: list[str] = []
    if job == "train":
        if not any(o.lstrip("+~").split("=", 1)[0] == "train.out_dir" for o in kept):
            extra.append(f"train.out_dir=runs/{name}")
        if not any(o.lstrip("+~").split("=", 1)[0] == "train.resume" for o in kept):
            extra.append("train.resume=auto")
    dirs = [arg for d in config_dirs for arg in ("-cd", d)]
    return [job, *dirs, *kept, *extra]


def torchrun_line(settings: LaunchSettings, head: str, rdzv_id: str, arguments: Sequence[str]) -> str:
    """One node's command: torchrun with the c10d rendezvous on ``head``."""
    words = [
        "python -m torch.distributed.run",
        f"--nnodes={settings.nodes}",
        f"--nproc_per_node={settings.gpus_per_node}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={head}:{settings.port}",
        f"--rdzv_id={rdzv_id}",
        f"--max-restarts={settings.max_restarts}",
        "-m te_assembly",
        *(shlex.quote(a) for a in arguments),
    ]
    return " ".join(words)


def render(settings: LaunchSettings, arguments: Sequence[str], written_by: str, workdir: str) -> Script:
    """The script of ``settings.scheduler`` running ``arguments`` on every rank, in ``workdir`` (where
    ``launch`` ran: the config folders, data and run folders are found from there, on every node)."""
    header = f"# Written by: {written_by}\n"
    if settings.scheduler == "slurm":
        return _sbatch(settings, arguments, header, workdir)
    if settings.scheduler == "skypilot":
        return _skypilot(settings, arguments, header, workdir)
    line = torchrun_line(settings, settings.head, settings.name, arguments)
    unset = " (set HEAD_NODE_ADDR to the first node's address)" if settings.head.startswith("$") else ""
    nodes = [
        f"# node {rank + 1} of {settings.nodes}{unset}:\ncd {shlex.quote(workdir)} && {line}"
        for rank in range(settings.nodes)
    ]
    text = header + "\n\n".join(nodes) + "\n"
    return Script(f"{settings.name}.torchrun.sh", text, "run each node's line on that node")


def _sbatch(settings: LaunchSettings, arguments: Sequence[str], header: str, workdir: str) -> Script:
    optional = {"time": settings.time, "partition": settings.partition, "account": settings.account}
    directives = [
        f"--job-name={settings.name}",
        f"--nodes={settings.nodes}",
        "--ntasks-per-node=1",
        f"--gpus-per-node={settings.gpus_per_node}",
        f"--chdir={shlex.quote(workdir)}",
        f"--output={settings.name}-%j.out",
        "--requeue",
        *(f"--{key}={value}" for key, value in optional.items() if value is not None),
        *([f"--signal=B:USR1@{settings.requeue_before_s}"] if settings.requeue_before_s else []),
    ]
    line = torchrun_line(settings, '"$head"', '"$SLURM_JOB_ID"', arguments)
    body = [
        "#!/bin/bash",
        *(f"#SBATCH {d}" for d in directives),
        header.rstrip(),
        "# A preempted job is requeued by Slurm; one near its time limit requeues itself (USR1). Either",
        "# way Slurm sends every process SIGTERM: every rank writes a checkpoint of the step it ended and",
        "# exits 143, and the requeued job resumes there (train.resume=auto).",
        "trap 'scontrol requeue \"$SLURM_JOB_ID\"' USR1",
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"srun --kill-on-bad-exit=1 {line} &",
        "pid=$!",
        "wait $pid  # returns early when USR1 arrives (the trap requeues the job)",
        "wait $pid  # then until every rank has written its checkpoint and exited",
    ]
    return Script(f"{settings.name}.sbatch", "\n".join(body) + "\n", "sbatch")


def _skypilot(settings: LaunchSettings, arguments: Sequence[str], header: str, workdir: str) -> Script:
    accelerator = SKYPILOT_ACCELERATORS.get(settings.accelerator or "h100", "H100")
    line = torchrun_line(settings, '"$head"', settings.name, arguments)
    body = [
        header.rstrip(),
        f"name: {settings.name}",
        f"num_nodes: {settings.nodes}",
        "resources:",
        f"  accelerators: {accelerator}:{settings.gpus_per_node}",
        *(["  use_spot: true", "  job_recovery: FAILOVER"] if settings.spot else []),
        f"workdir: {json.dumps(workdir)}",
        "setup: |",
        *(f"  {line}" for line in settings.setup.splitlines()),
        "run: |",
        '  head=$(echo "$SKYPILOT_NODE_IPS" | head -n 1)',
        f"  {line}",
    ]
    return Script(
        f"{settings.name}.sky.yaml",
        "\n".join(body) + "\n",
        "sky jobs launch" if settings.spot else "sky launch",
    )


__all__ = ["JOBS", "SCHEDULERS", "LaunchSettings", "Script", "job_arguments", "render", "torchrun_line"]
