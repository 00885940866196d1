"""``launch`` as a user runs it, from a folder of their own: the layout checked for nodes x GPUs before any
machine is used (the world size, the memory of the fullest rank), then the Slurm, SkyPilot or torchrun
script, checked line by line. (Running the torchrun lines as two nodes: tests/parallel/test_two_nodes.py.)"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from tests.conftest import user_cli

pytestmark = pytest.mark.slow

JOB = ["model=moe_block", "parallel.expert=4", "parallel.data=4", "train.steps=1000"]


def _script(folder: Path, suffix: str) -> str:
    (path,) = folder.glob(f"*{suffix}")
    return path.read_text()


def _command_of(line: str) -> list[str]:
    """The te_assembly arguments of a torchrun line (after ``-m te_assembly``)."""
    words = shlex.split(line)
    return words[words.index("te_assembly") + 1 :]


def test_slurm_script_line_by_line(tmp_path: Path) -> None:
    done = user_cli(
        tmp_path,
        "launch",
        *JOB,
        "launch.nodes=2",
        "launch.gpus_per_node=8",
        "launch.time=04:00:00",
        "launch.partition=gpu",
        "launch.name=moe16",
        "hydra.run.dir=out",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 node(s) x 8 = 16 ranks: data 4 x tensor 1 x expert 4 = 16 process(es)" in done.stdout
    assert "per rank of 16" in done.stdout and "fits (one H100 SXM holds" in done.stdout
    assert f"next: sbatch {tmp_path / 'out' / 'moe16.sbatch'}" in done.stdout
    lines = _script(tmp_path / "out", ".sbatch").splitlines()
    assert lines[0] == "#!/bin/bash"
    directives = [line.removeprefix("#SBATCH ") for line in lines if line.startswith("#SBATCH ")]
    assert directives == [
        "--job-name=moe16",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--gpus-per-node=8",
        f"--chdir={tmp_path}",
        "--output=moe16-%j.out",
        "--requeue",
        "--time=04:00:00",
        "--partition=gpu",
        "--signal=B:USR1@300",
    ]
    assert "trap 'scontrol requeue \"$SLURM_JOB_ID\"' USR1" in lines
    assert 'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in lines
    (srun,) = [line for line in lines if line.startswith("srun ")]
    assert srun.startswith("srun --kill-on-bad-exit=1 python -m torch.distributed.run --nnodes=2 ")
    for flag in (
        "--nproc_per_node=8",
        "--rdzv_backend=c10d",
        '--rdzv_endpoint="$head":29500',
        '--rdzv_id="$SLURM_JOB_ID"',
        "--max-restarts=3",
    ):
        assert f" {flag} " in srun, flag
    assert srun.endswith(" &")
    assert _command_of(srun.removesuffix(" &")) == [
        "train",
        *JOB,
        "train.out_dir=runs/moe16",
        "train.resume=auto",
    ]
    assert lines[-2:] == [
        "wait $pid  # returns early when USR1 arrives (the trap requeues the job)",
        "wait $pid  # then until every rank has written its checkpoint and exited",
    ]


def test_skypilot_task_reads_as_yaml(tmp_path: Path) -> None:
    done = user_cli(
        tmp_path,
        "launch",
        *JOB,
        "launch.nodes=4",
        "launch.gpus_per_node=4",
        "launch.scheduler=skypilot",
        "launch.accelerator=h200",
        "launch.spot=true",
        "hydra.run.dir=out",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    task = yaml.safe_load(_script(tmp_path / "out", ".sky.yaml"))
    assert task["num_nodes"] == 4 and task["name"] == "te_assembly"
    assert task["resources"] == {"accelerators": "H200:4", "use_spot": True, "job_recovery": "FAILOVER"}
    assert task["workdir"] == str(tmp_path)
    assert task["setup"].strip() == "pip install 'te_assembly[te]'"
    head, line = task["run"].strip().splitlines()
    assert head == 'head=$(echo "$SKYPILOT_NODE_IPS" | head -n 1)'
    assert "--nnodes=4 --nproc_per_node=4 " in line and '--rdzv_endpoint="$head":29500' in line
    assert _command_of(line) == ["train", *JOB, "train.out_dir=runs/te_assembly", "train.resume=auto"]
    assert f"next: sky jobs launch {tmp_path / 'out' / 'te_assembly.sky.yaml'}" in done.stdout


def test_a_layout_for_other_machines_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """16 ranks for a layout of 4: exit 2 at launch.nodes with the data-parallel size that fills them; a
    model whose fullest rank does not fit one accelerator: exit 2 at launch.accelerator, in numbers."""
    wrong = user_cli(
        tmp_path,
        "launch",
        "model=moe_block",
        "parallel.expert=4",
        "launch.nodes=2",
        "launch.gpus_per_node=8",
        "hydra.run.dir=wrong",
    )
    assert wrong.returncode == 2, wrong.stdout + wrong.stderr
    assert (
        "launch.nodes: launch.nodes=2 x launch.gpus_per_node=8 = 16 ranks, but the layout is data 1 x "
        "tensor 1 x expert 4 = 4 process(es) (parallel.data=4 uses them all)" in wrong.stderr
    )
    big = user_cli(
        tmp_path,
        "launch",
        "model=residual_mlp",
        "model.dims.hidden=65536",
        "model.dims.ffn=262144",
        "launch.nodes=1",
        "launch.gpus_per_node=1",
        "launch.accelerator=l40s",
        "hydra.run.dir=big",
    )
    assert big.returncode == 2, big.stdout + big.stderr
    assert "launch.accelerator: residual_mlp: 770.1 GiB on one device" in big.stderr
    assert "but one L40S holds 44.7 GiB" in big.stderr
    assert not (tmp_path / "wrong").exists() and not (tmp_path / "big").exists()
    unknown = user_cli(tmp_path, "launch", "model=moe_block", "launch.scheduler=pbs", "hydra.run.dir=u")
    assert (
        unknown.returncode == 2
        and "launch.scheduler: scheduler must be one of slurm, skypilot, torchrun" in unknown.stderr
    )


def test_the_multi_node_guides_commands_run_as_written(tmp_path: Path) -> None:
    """Each command of docs/guides/multi-node.md, run as written from a folder of the user's: it checks
    the job and writes the script of its scheduler."""
    from tests.docs_text import block_after

    commands = [
        line
        for line in block_after("guides/multi-node.md", "# Multi-node", "bash").splitlines()
        if line.startswith("python -m te_assembly ")
    ]
    assert len(commands) == 3
    for number, command in enumerate(commands):
        words = shlex.split(command)[3:]
        done = user_cli(tmp_path, *words, f"hydra.run.dir=guide{number}")
        assert done.returncode == 0, command + done.stdout + done.stderr
        written = [p.name for p in (tmp_path / f"guide{number}").iterdir() if p.name != "config.yaml"]
        assert written == [("te_assembly.sbatch", "te_assembly.sky.yaml", "te_assembly.torchrun.sh")[number]]
