"""The shipped transformers through every command, as a user runs them (a fresh process, from a
directory outside the repository): validate, explain, graph, run, train, bench (with compare) and verify
through TE's fusers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
MODELS = ["moe_transformer", "dense_transformer"]
STEPS = {"moe_transformer": 36, "dense_transformer": 26}
"""Two layers of 17 (moe_layer) or 12 (dense_layer) steps, the final norm and the projection."""


def _cli(cwd: Path, command: str, model: str, *overrides: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb", "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "te_assembly", command, f"model={model}", *overrides],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize("model", MODELS)
def test_validate_reports_the_rerouted_residuals(tmp_path: Path, model: str) -> None:
    done = _cli(tmp_path, "validate", model)
    assert done.returncode == 0, done.stdout + done.stderr
    outputs = 2 if model == "moe_transformer" else 0
    assert f"valid — {STEPS[model]} steps, 3 fuser(s)" in done.stdout
    assert f"{outputs} public output(s)" in done.stdout
    assert (
        "rerouted across modules: 2 channel(s): layers.0.attn_residual (fuser 0 -> 1, across layers.0.attn); "
        "layers.1.attn_residual (fuser 1 -> 2, across layers.1.attn)" in done.stdout
    )
    done = _cli(tmp_path, "validate", model, "model.dims.layers=4")
    assert done.returncode == 0 and "rerouted across modules: 4 channel(s)" in done.stdout


@pytest.mark.parametrize("model", MODELS)
def test_explain_and_graph(tmp_path: Path, model: str) -> None:
    done = _cli(tmp_path, "explain", model)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "attn_residual" in done.stdout and "Attention" in done.stdout
    done = _cli(tmp_path, "graph", model, f"graph.out_dir={tmp_path / 'g'}", "graph.formats=[mermaid,dot]")
    assert done.returncode == 0, done.stdout + done.stderr
    mermaid = (tmp_path / "g" / f"{model}.mmd").read_text()
    assert "attn_residual" in mermaid and "Attention" in mermaid


SMALL_RUN = ("run.steps=1", "run.tokens=64", "run.seq_len=16")


def _check_run(done: subprocess.CompletedProcess[str], model: str, channels: bool = True) -> None:
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"│ y\s+│ \(4, 16, 64\)", done.stdout)
    aux = re.findall(r"│ (layers\.\d\.aux_loss)\s+│ \(\)", done.stdout)
    assert aux == (["layers.0.aux_loss", "layers.1.aux_loss"] if model == "moe_transformer" else [])
    if not channels:  # per-channel gradients are recorded by the reference engine only
        return
    # The rerouted residual's gradient is reported like any channel's, summed over its consumers.
    assert re.search(
        r"│ layers\.0\.attn_residual\s+│ layers\.0\.attn_residual\.out\s+│ layers\.0\.add_attn\.addend",
        done.stdout,
    )


@pytest.mark.parametrize("model", MODELS)
def test_run_in_the_reference_engine(tmp_path: Path, model: str) -> None:
    _check_run(_cli(tmp_path, "run", model, "engine=reference", *SMALL_RUN), model)


@pytest.mark.parametrize("model", MODELS)
def test_train_lowers_the_loss(tmp_path: Path, model: str) -> None:
    out_dir = tmp_path / "train_out"
    done = _cli(
        tmp_path,
        "train",
        model,
        "engine=reference",
        "train.steps=30",
        "train.batch_tokens=64",
        "train.seq_len=16",
        f"train.out_dir={out_dir}",
        "train.plot=false",
        "train.checkpoint_every=0",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 31))
    losses = [r["loss"] for r in records]
    assert len(losses) == 30
    assert sum(losses[-5:]) < 0.9 * sum(losses[:5]), losses


@pytest.mark.parametrize("model", MODELS)
def test_bench_compare_builds_the_hand_split_model(tmp_path: Path, model: str) -> None:
    report = tmp_path / "bench.json"
    done = _cli(
        tmp_path,
        "bench",
        model,
        "engine=reference",
        "bench.tokens=64",
        "bench.seq_len=16",
        "bench.warmup=0",
        "bench.repeats=1",
        "bench.compare=true",
        f"bench.report={report}",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "(b) 3 parts, cut before step(s) 'layers.0.proj' (model.ops[4]), 'layers.1.proj' "
        f"(model.ops[{4 + STEPS[model] // 2 - 1}])" in done.stdout
    )
    assert "layers.0.attn_residual -> layers.0.add_attn_addend" in done.stdout
    for name in ("(a) channelled, rerouted", "(b) split, public tensors", "(c) plain PyTorch"):
        assert re.search(rf"│ {re.escape(name)}\s+│\s+[\d.]+ \([\d.]+x\)", done.stdout), name
    assert json.loads(report.read_text())["rank0"]["tokens"] == 64


@pytest.mark.te
@pytest.mark.parametrize("model", MODELS)
def test_run_and_verify_through_te_fusers(tmp_path: Path, model: str) -> None:
    _check_run(_cli(tmp_path, "run", model, "engine=te", "kernels=reference", *SMALL_RUN), model, False)
    done = _cli(
        tmp_path, "verify", model, "engine=te", "kernels=reference", "run.tokens=64", "run.seq_len=16"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    count = re.search(r"verify passed: (\d+) tensors match", done.stdout)
    assert count, done.stdout
    # Every row passes, and the gradients of both layers' first ops (reached through the rerouted
    # residual) are among them.
    rows = re.findall(r"│ (grad steps\.layers\.\d\.attn_norm\.weight)\s+│ param grad .*│ pass", done.stdout)
    assert rows == ["grad steps.layers.0.attn_norm.weight", "grad steps.layers.1.attn_norm.weight"]
    assert "fail" not in done.stdout.split("verify passed")[0].lower().replace("failures", "")
