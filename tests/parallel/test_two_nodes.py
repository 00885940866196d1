"""Two nodes on this machine: ``launch launch.scheduler=torchrun`` writes each node's torchrun line (c10d
rendezvous on the first node, here 127.0.0.1), both lines run as written as two torchrun agents of one
process each, and the job trains data parallel, FSDP2 and expert parallel to the losses of one node with
the same world size."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.parallel.test_torchrun import SMALL_MLP, SMALL_MOE, TRAIN, _env, _losses, _ok, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _node_lines(tmp_path: Path, job: list[str], name: str) -> list[str]:
    """The launch command's torchrun script for 2 nodes x 1 GPU, one line per node."""
    env = _env()
    launched = subprocess.run(
        [
            sys.executable,
            "-m",
            "te_assembly",
            "launch",
            *job,
            "launch.scheduler=torchrun",
            "launch.nodes=2",
            "launch.gpus_per_node=1",
            "launch.head=127.0.0.1",
            f"launch.port={_free_port()}",
            f"launch.name={name}",
            "launch.max_restarts=0",
            "launch.accelerator=null",
            f"hydra.run.dir=launch-{name}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    _ok(launched)
    text = (tmp_path / f"launch-{name}" / f"{name}.torchrun.sh").read_text()
    lines = [line for line in text.splitlines() if line.startswith("cd ")]
    assert len(lines) == 2 and lines[0] == lines[1]  # c10d gives each node its ranks
    return lines


def _two_nodes(tmp_path: Path, lines: list[str]) -> None:
    env = _env()
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])  # its `python`
    nodes = [
        subprocess.Popen(
            ["bash", "-c", line],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for line in lines
    ]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    for node, out in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, out[-3000:]


@pytest.mark.parametrize(
    ("name", "job"),
    [
        ("data", [*SMALL_MLP, "parallel.data=2"]),
        ("fsdp", [*SMALL_MLP, "parallel.shard=2", "engine=reference"]),
        ("expert", [*SMALL_MOE, "parallel.expert=2"]),
    ],
)
def test_two_nodes_train_as_one_node_of_the_same_size(name: str, job: list[str], tmp_path: Path) -> None:
    train = ["train", *job, *TRAIN]
    _two_nodes(tmp_path, _node_lines(tmp_path, train[1:], name))
    one = torchrun([*train, "train.out_dir=one"], tmp_path)
    _ok(one)
    assert _losses(tmp_path / "runs" / name) == pytest.approx(_losses(tmp_path / "one"), rel=1e-6, abs=1e-9)
    assert len(_losses(tmp_path / "one")) == 8
