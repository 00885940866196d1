"""The ranks of a job compare te_assembly's code and the resolved config at start
(``engines/parallel/runtime.same_everywhere``): a node left on another checkout, or given another
command, fails every rank with one message naming the odd ranks, before anything is built."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.parallel._worlds import spawn_world

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def _check(rank: int, configs: list[str], codes: list[str], out: str) -> None:
    from te_assembly.engines.parallel import runtime
    from te_assembly.errors import ParallelError

    runtime.source_sha256 = lambda: codes[rank]  # type: ignore[assignment]  # this rank's "checkout"
    try:
        runtime.same_everywhere(configs[rank])
        said = "agreed"
    except ParallelError as exc:
        said = str(exc)
    Path(out, f"rank{rank}.txt").write_text(said)


def _said(tmp_path: Path, world: int) -> list[str]:
    return [(tmp_path / f"rank{r}.txt").read_text() for r in range(world)]


def test_the_same_code_and_config_agree(tmp_path: Path) -> None:
    spawn_world(2, _check, ["c" * 64] * 2, ["a" * 64] * 2, str(tmp_path))
    assert _said(tmp_path, 2) == ["agreed", "agreed"]


def test_another_config_on_one_rank_fails_every_rank_naming_it(tmp_path: Path) -> None:
    configs = ["c" * 64, "c" * 64, "d" * 64]
    spawn_world(3, _check, configs, ["a" * 64] * 3, str(tmp_path))
    expected = (
        "rank 2 of 3 runs another resolved config than rank 0 (sha256 dddddddddddd... against "
        "cccccccccccc...): every node must run the same command on the same config files"
    )
    assert _said(tmp_path, 3) == [expected] * 3


def test_other_code_is_named_before_the_config(tmp_path: Path) -> None:
    spawn_world(2, _check, ["c" * 64, "d" * 64], ["a" * 64, "b" * 64], str(tmp_path))
    said = _said(tmp_path, 2)
    assert said[0] == said[1]
    assert said[0].startswith("rank 1 of 2 runs another te_assembly code than rank 0 (sha256 bbbbbbbbbbbb...")
    assert said[0].endswith("install the same te_assembly on every node")


def test_a_rank_that_cannot_reach_the_rendezvous_says_so(tmp_path: Path) -> None:
    """A node given a rendezvous nobody serves (the first node down, a wrong port): the rank fails within
    parallel.timeout_s with one line naming itself and the address, not a traceback."""
    import os
    import socket
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "NO_COLOR": "1",
        "COLUMNS": "400",
        "RANK": "1",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "te_assembly",
            "train",
            "model=residual_mlp",
            "train.steps=2",
            "parallel.data=2",
            "parallel.timeout_s=3",
            "hydra.run.dir=run",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        f"[rank 1/2] error: rank 1 of 2 cannot reach the rendezvous at 127.0.0.1:{port} within "
        "parallel.timeout_s=3 (" in done.stderr
    ), done.stderr
    assert "Traceback" not in done.stderr
