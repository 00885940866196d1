"""A new user's path, from a folder outside the repository: train a shipped language model on their own
text with a BPE trained on it, generate from the run, export it, load it with from_pretrained."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

import te_assembly

REPO_ROOT = Path(__file__).resolve().parents[2]
SMALL = ["model.dims.layers=1", "model.dims.hidden=32", "model.dims.head_dim=8", "model.dims.ffn=64"]


def test_train_generate_export_on_their_own_text(tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "300", "NO_COLOR": "1", "TERM": "dumb", "PYTHONPATH": str(REPO_ROOT)}
    env["TE_ASSEMBLY_CACHE"] = str(tmp_path / "cache")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "te_assembly", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    notes = tmp_path / "notes"
    notes.mkdir()
    for i in range(6):
        (notes / f"n{i}.md").write_text(
            f"# Note {i}\n" + "A fox jumps over the lazy dog near the river. " * 30
        )
    train = ["train", "model=moe_lm", *SMALL, "data.path=notes", "data.tokenizer.train_vocab=300"]
    train += [
        "model.dims.vocab=304",
        "train.steps=6",
        "train.batch_tokens=256",
        "train.seq_len=32",
        "train.eval_every=3",
    ]
    done = cli(*train, "train.out_dir=run")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "next-token cross-entropy on data.path=notes (a BPE of 300 trained on it)" in done.stdout
    assert "step 6: validation loss" in done.stdout
    run = tmp_path / "run"
    assert (run / "tokenizer.json").is_file()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val_loss" in r] == [3, 6]

    done = cli("generate", "A fox", "run", "generate.max_new_tokens=8", "generate.temperature=0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"tokenizer {Path('run') / 'tokenizer.json'}; greedy" in done.stdout and "A fox" in done.stdout

    done = cli("export", "run", "shared")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "shared" / "tokenizer.json").read_text() == (run / "tokenizer.json").read_text()
    model = te_assembly.from_pretrained(tmp_path / "shared", "reference")
    assert model.step_module("head").basic_ops[0].weight is model.step_module("embed").weight
    y, extras = model(torch.zeros(1, 4, dtype=torch.int64))
    assert y.shape == (1, 4, 304) and set(extras) == set(model.loss_output_names)

    # a model's vocabulary smaller than the tokenizer's is refused before the run starts
    done = cli(*train[:-2], "model.dims.vocab=256", "train.steps=2", "train.out_dir=small")
    assert done.returncode == 1 and "vocabulary has 256 ids" in done.stdout + done.stderr
    assert not (tmp_path / "small").exists() or not any((tmp_path / "small").glob("ckpt-*"))
