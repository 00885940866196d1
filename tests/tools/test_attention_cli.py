"""A decoder layer with attention (tests/configs/model/attention_layer.yaml: pre-norm GQA + RoPE
attention, its residual as a public output and input around the Attention module, a top-k MoE MLP
behind token views) through every command, as a user's own model in their own folder (``-cd``), run from
a directory outside the repository."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
LAYER = REPO_ROOT / "tests" / "configs" / "model" / "attention_layer.yaml"
SMALL = ["run.tokens=64", "run.seq_len=16"]


@pytest.fixture
def user(tmp_path: Path) -> Path:
    (tmp_path / "mine" / "model").mkdir(parents=True)
    shutil.copy(LAYER, tmp_path / "mine" / "model" / "decoder.yaml")
    return tmp_path


def _cli(cwd: Path, command: str, *overrides: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb", "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "te_assembly", command, "-cd", "mine", "model=decoder", *overrides],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_validate_and_explain(user: Path) -> None:
    done = _cli(user, "validate")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "valid — 17 steps, 2 fuser(s)" in done.stdout
    done = _cli(user, "explain")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert re.search(r"│\s+3 │ attn\s+│ Attention\s+│ -\s+│ \(module: ends the fuser\)\s+│ 64 -> 32", out)
    assert re.search(r"│\s+9 │ router\s+│ TopKRouter .*│ 32 -> 32 \(token rows\)", out)
    assert "call signature: model(x, add_attn_addend) -> (y, residual, aux_loss)" in out
    assert "[batch, seq, 32] (from input_layout: sequence)" in out


def test_validate_reports_layout_and_sequence_errors(user: Path) -> None:
    text = (user / "mine" / "model" / "decoder.yaml").read_text()
    broken = text.replace(
        "  - name: flatten\n    op: FlattenTokens\n", "  - name: flatten\n    op: Identity\n"
    )
    broken = broken.replace(
        "    extra_outputs:\n      token_shape: {channel: token_shape, public: false}\n", "", 1
    )
    (user / "mine" / "model" / "decoder.yaml").write_text(broken)
    done = _cli(user, "validate", "run.tokens=100")
    assert done.returncode == 2
    out = done.stdout + done.stderr
    assert re.search(
        r"decoder\.yaml:\d+: error: model\.ops\[10\]\.op: Dispatch step 'dispatch' needs the main path", out
    )
    assert "run.tokens: decoder takes x as [batch, seq, features]" not in out  # the model is invalid
    (user / "mine" / "model" / "decoder.yaml").write_text(text)
    done = _cli(user, "validate", "run.tokens=100")
    assert done.returncode == 2
    assert (
        "run.tokens=100 rows are not whole sequences of run.seq_len=32 positions" in done.stdout + done.stderr
    )


def test_run_in_the_reference_engine(user: Path) -> None:
    done = _cli(user, "run", "engine=reference", "run.steps=2", *SMALL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"│ y\s+│ \(4, 16, 32\)", done.stdout)
    assert re.search(r"│ residual\s+│ \(4, 16, 32\)", done.stdout)
    assert re.search(r"engine reference: loss \d", done.stdout)


@pytest.mark.te
def test_run_and_verify_through_te_fusers(user: Path) -> None:
    done = _cli(user, "run", "engine=te", "kernels=reference", "run.steps=2", *SMALL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "engine te:" in done.stdout
    done = _cli(user, "verify", "engine=te", "kernels=reference", *SMALL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"verify passed: \d+ tensors match", done.stdout)
    assert re.search(r"│ grad add_attn_addend\s+│ input grad\s+│ \(4, 16, 32\)", done.stdout)


def test_kernels_te_on_cpu_names_the_attention_step(user: Path) -> None:
    pytest.importorskip("transformer_engine.pytorch", reason="needs TE importable")
    done = _cli(user, "run", "engine=te", "device=cpu", *SMALL)
    assert done.returncode == 1
    assert "attn (Attention)" in done.stdout + done.stderr


def test_train_and_bench(user: Path) -> None:
    out_dir = user / "train_out"
    done = _cli(
        user,
        "train",
        "engine=reference",
        "train.steps=4",
        "train.batch_tokens=32",
        "train.seq_len=8",
        f"train.out_dir={out_dir}",
        "train.plot=false",
        "train.checkpoint_every=0",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    report = user / "bench.json"
    done = _cli(
        user,
        "bench",
        "engine=reference",
        "bench.tokens=64",
        "bench.seq_len=16",
        "bench.warmup=0",
        "bench.repeats=1",
        "bench.compare=true",
        f"bench.report={report}",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "64 tokens" in done.stdout
    # 2 * 64 * (32*64 + 32*32) for qkv and proj, the router's 2 * 64 * 32 * 4, the experts (top 2 of
    # 64 tokens: 128 rows through 32 -> 64 and 32 -> 32), attention 4 * 4 sequences * 4 heads * 8 * 136
    linears = 2 * 64 * (32 * 64 + 32 * 32) + 2 * 64 * 32 * 4 + 2 * 128 * (32 * 64 + 32 * 32)
    # FlopCounterMode counts what the reference runs: every (query, key) pair of the causal attention's
    # two batched GEMMs (the catalog, used for TE's kernels, counts the causal half, 16 * 17 / 2).
    attention = 4 * 4 * 4 * 8 * (16 * 16)
    assert f"FLOPs per call: forward {linears + attention:,}, backward" in done.stdout
    assert "from torch.utils.flop_counter.FlopCounterMode" in done.stdout
    assert json.loads(report.read_text())["rank0"]["tokens"] == 64
