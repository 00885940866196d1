"""The configs guide's two-file example (docs/guides/configs-and-blocks.md) (a layer block and a model
repeating it) as a new user would use it: both files copied from the README into a folder of their own,
every command run from a directory outside the repository with the README's words (``python -m
te_assembly COMMAND -cd mine model=my_moe``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_text import blocks

REPO_ROOT = Path(__file__).resolve().parents[2]
FILE_LINE = re.compile(r"^# (mine/(?:block|model)/\w+\.yaml)\b")


def readme_files() -> dict[str, str]:
    """Every ```yaml block of the blocks guide whose first line names a file under mine/."""
    found = {}
    for block in blocks("guides/configs-and-blocks.md"):
        match = FILE_LINE.match(block)
        if match:
            found[match.group(1)] = block
    return found


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("new_user")
    files = readme_files()
    assert set(files) == {"mine/block/my_layer.yaml", "mine/model/my_moe.yaml"}
    for name, text in files.items():
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(text)
    return home


def _cli(cwd: Path, command: str, *overrides: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb", "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "te_assembly", command, "-cd", "mine", "model=my_moe", *overrides],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_readme_example_is_two_short_files() -> None:
    files = readme_files()
    assert all(len(text.splitlines()) <= 45 for text in files.values())


def test_validate_counts_the_layers_and_lists_the_reroutes(user: Path) -> None:
    done = _cli(user, "validate")
    assert done.returncode == 0, done.stdout + done.stderr
    # 4 layers of 17 steps and the final norm; each layer's attention ends a fuser.
    assert "valid — 69 steps, 5 fuser(s)" in done.stdout
    assert "4 public output(s)" in done.stdout
    assert "rerouted across modules: 4 channel(s): layers.0.res1 (fuser 0 -> 1, across layers.0.attn)" in (
        done.stdout
    )
    done = _cli(user, "validate", "model.dims.layers=2")
    assert "valid — 35 steps, 3 fuser(s)" in done.stdout, done.stdout + done.stderr


def test_a_mistake_inside_the_block_points_at_the_block_file(user: Path) -> None:
    done = _cli(user, "validate", "block.my_layer.ops.3.args.num_kv_heads=3")
    assert done.returncode == 2
    out = done.stdout + done.stderr
    where = r"my_layer\.yaml:(\d+): error: model\.layers\[0-3\] \(block my_layer\): ops\[3\]\.args\.num_heads"
    match = re.search(where, out)
    assert match, out
    lines = (user / "mine" / "block" / "my_layer.yaml").read_text().splitlines()
    assert "name: attn, module: Attention" in lines[int(match.group(1)) - 1]


def test_explain_and_graph(user: Path) -> None:
    done = _cli(user, "explain")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "layers.3.aux_loss" in done.stdout or "layers[0-3].aux_loss" in done.stdout
    out_dir = user / "graphs"
    done = _cli(user, "graph", f"graph.out_dir={out_dir}", "graph.formats=[mermaid,dot]")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "res1" in (out_dir / "my_moe.mmd").read_text()
    assert "res1" in (out_dir / "my_moe.dot").read_text()


def test_run_returns_every_layers_aux_loss(user: Path) -> None:
    done = _cli(user, "run", "engine=reference", "run.steps=1", "run.tokens=64", "run.seq_len=16")
    assert done.returncode == 0, done.stdout + done.stderr
    for u in range(4):
        assert re.search(rf"│ layers\.{u}\.aux_loss\s+│ \(\)", done.stdout), done.stdout
    assert re.search(r"│ y\s+│ \(4, 16, 32\)", done.stdout)


def test_train_lowers_the_loss(user: Path) -> None:
    out_dir = user / "train_out"
    done = _cli(
        user,
        "train",
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


@pytest.mark.te
def test_verify_through_te_fusers(user: Path) -> None:
    done = _cli(user, "verify", "engine=te", "kernels=reference", "run.tokens=64", "run.seq_len=16")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"verify passed: \d+ tensors match", done.stdout)
    assert re.search(r"│ grad steps\.layers\.3\.fc2\.weight0\s+│ param grad", done.stdout)
