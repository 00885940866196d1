"""The CLI under a real ``torchrun`` (two CPU processes, gloo): train with expert and data parallelism,
exact resume, refusal of another layout, a failing rank, bench's per-rank report and rank-0-only output.

Each launch costs seconds (two fresh Python processes import torch), so each test makes as few as it can.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from te_assembly.jobs.train.metrics import read_records
from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

SMALL_MOE = ["model=moe_block", "model.dims.hidden=16", "model.dims.ffn=16"]
SMALL_MLP = ["model=residual_mlp", "model.dims.hidden=16", "model.dims.ffn=32"]
TRAIN = [
    "train.steps=8",
    "train.batch_tokens=32",
    "train.checkpoint_every=4",
    "train.plot=false",
    "train.warmup_steps=2",
]


def _env() -> dict[str, str]:
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    return env


def torchrun(
    args: list[str], cwd: Path, nproc: int = 2, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc_per_node=N -m te_assembly ARGS`` (standalone: a free port, so
    concurrent jobs on one machine never meet)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    return subprocess.run(
        [*command, "-m", "te_assembly", *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def single(args: list[str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "te_assembly", *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def records_written(run: Path) -> int:
    """How many steps ``run``'s metrics.jsonl holds so far (rank 0 writes it as the steps go)."""
    metrics = run / "metrics.jsonl"
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


def _losses(path: Path) -> list[float]:
    return [float(r["loss"]) for r in read_records(path / "metrics.jsonl")]


def _ok(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_expert_parallel_train_resumes_exactly_and_refuses_another_layout(tmp_path: Path) -> None:
    """The issue's command at small size: checkpoints written once, by one process, atomically; a resume
    gives exactly the uninterrupted run's losses; a single process refuses that checkpoint."""
    full = torchrun(["train", *SMALL_MOE, *TRAIN, "parallel.expert=2", "train.out_dir=full"], tmp_path)
    _ok(full)
    written = {p.name for p in (tmp_path / "full").iterdir()} - {"tensorboard"}  # when it is installed
    assert sorted(written) == [  # rank 0 held the directory for the job and removed its lock at the end
        "ckpt-0000004.safetensors",
        "ckpt-0000008.safetensors",
        "config.yaml",
        "metrics.jsonl",
    ]  # no temp files, no per-rank copies
    assert full.stdout.count("wrote full/ckpt-0000008.safetensors") == 1  # rank 0 alone reports
    cut = torchrun(
        ["train", *SMALL_MOE, *TRAIN, "parallel.expert=2", "train.out_dir=cut", "train.stop_after=4"],
        tmp_path,
    )
    _ok(cut)
    resumed = torchrun(
        ["train", *SMALL_MOE, *TRAIN, "parallel.expert=2", "train.out_dir=cut", "train.resume=true"], tmp_path
    )
    _ok(resumed)
    assert "resumed from cut/ckpt-0000004.safetensors (step 4)" in resumed.stdout
    assert _losses(tmp_path / "cut") == _losses(tmp_path / "full")

    refused = single(["train", *SMALL_MOE, *TRAIN, "train.out_dir=full", "train.resume=true"], tmp_path)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "cannot resume from full/ckpt-0000008.safetensors with another parallel layout" in refused.stderr
    assert "parallel.expert: checkpoint 2, now 1" in refused.stderr


def test_data_and_tensor_parallel_train_match_one_process(tmp_path: Path) -> None:
    """Without MoE the mean over equal row shards is the whole batch's mean: the same run."""
    one = single(["train", *SMALL_MLP, *TRAIN, "train.out_dir=one"], tmp_path)
    _ok(one)
    data = torchrun(["train", *SMALL_MLP, *TRAIN, "parallel.data=2", "train.out_dir=data"], tmp_path)
    _ok(data)
    tensor = torchrun(["train", *SMALL_MLP, *TRAIN, "parallel.tensor=2", "train.out_dir=tensor"], tmp_path)
    _ok(tensor)
    expected = _losses(tmp_path / "one")
    for name in ("data", "tensor"):
        got = _losses(tmp_path / name)
        assert got == pytest.approx(expected, rel=1e-4), name
    # The data-parallel checkpoint is a single-process one: a single process resumes it (data may change).
    more = single(
        ["train", *SMALL_MLP, *TRAIN, "train.out_dir=data", "train.resume=true", "train.steps=10"], tmp_path
    )
    _ok(more)
    assert "another data-parallel size" in more.stdout


def test_a_failing_rank_ends_the_job_with_its_message(tmp_path: Path) -> None:
    result = torchrun(
        ["train", *SMALL_MLP, *TRAIN, "parallel.data=2", "parallel.fail_on_rank=1", "parallel.timeout_s=30"],
        tmp_path,
        timeout=120,  # a hang fails the test here instead of blocking it
    )
    assert result.returncode != 0
    assert "[rank 1/2] error: injected failure on rank 1 (parallel.fail_on_rank=1)" in result.stderr
    # Rank 0 either saw its collective fail (and says so in one line) or was stopped by torchrun.
    rank0 = [line for line in result.stderr.splitlines() if line.startswith("[rank 0/2]")]
    assert all("a collective failed on rank 0" in line for line in rank0), rank0


def test_bench_reports_every_rank_and_run_prints_once(tmp_path: Path) -> None:
    report = tmp_path / "bench.json"
    bench = torchrun(
        [
            "bench",
            *SMALL_MOE,
            "parallel.expert=2",
            "bench.tokens=64",
            "bench.warmup=1",
            "bench.repeats=3",
            f"bench.report={report}",
        ],
        tmp_path,
    )
    _ok(bench)
    assert "per rank: full step" in bench.stdout
    data = json.loads(report.read_text())
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    assert all(r["tokens"] == 32 for r in data["ranks"])
    assert data["job"]["tokens_per_s"] > 0
    assert 0 < data["job"]["comm_share"] < 1  # the all-to-all exchanges take some of every step

    run = torchrun(["run", *SMALL_MLP, "parallel.tensor=2", "run.tokens=16", "run.steps=2"], tmp_path)
    _ok(run)
    assert run.stdout.count("residual_mlp: steps") == 1  # the plan table, printed by rank 0 only
    assert "parallel: data 1 x tensor 2 x expert 1 = 2 process(es)" in run.stdout


def test_every_rank_runs_the_hydra_app_without_racing_on_files(tmp_path: Path) -> None:
    """A run writes nothing where it is launched; a sweep is recorded once, by rank 0; a config error is
    listed once, by rank 0, and the other ranks wait for it instead of exiting first (torchrun would stop
    rank 0 before it printed)."""
    run = torchrun(["validate", "model=residual_mlp", "parallel.tensor=2"], tmp_path)
    _ok(run)
    assert run.stdout.count("residual_mlp (") == 1 and "parallel: data 1 x tensor 2" in run.stdout
    assert list(tmp_path.iterdir()) == []

    sweep = torchrun(["validate", "-m", "model.dims.hidden=32,64", "parallel.data=2"], tmp_path)
    _ok(sweep)
    assert sweep.stdout.count("validate sweep: 2 job(s)") == 1
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == ["multirun.yaml"]

    wrong = torchrun(["validate", "parallel.expert=4"], tmp_path)
    assert wrong.returncode != 0
    assert wrong.stderr.count("torchrun started 2 process(es)") == 1, wrong.stderr
    assert "[rank 0/2] error: parallel: torchrun started 2 process(es)" in wrong.stderr
    # Rank 1 says so only if it gets there before rank 0's exit makes torchrun stop it (a race a
    # loaded machine can lose); it never lists the findings a second time.
    rank1 = [line for line in wrong.stderr.splitlines() if line.startswith("[rank 1/2]")]
    assert all(line == "[rank 1/2] error: 1 config finding(s), listed by rank 0" for line in rank1), rank1
