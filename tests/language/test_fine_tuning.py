"""Fine-tuning as the guide says: ``train.epochs`` walks the training split pass after pass (every
sequence or conversation once a pass, the steps derived from it, the same rows on a resume), and the
guide's recipes (``finetune=full``, ``finetune=lora``) run as written on a transformers-made model from
a folder outside the repository."""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path

import pytest
import torch

from te_assembly import load
from te_assembly.data.batch_seeds import epoch_units
from te_assembly.data.settings import DataSettings
from te_assembly.engines.target import Target
from te_assembly.errors import ConfigError
from te_assembly.jobs.train.job import train
from te_assembly.jobs.train.lm_task import LanguageTask
from te_assembly.jobs.train.metrics import read_records
from te_assembly.jobs.train.settings import TrainSettings
from tests.conftest import user_cli
from tests.docs_text import block_after


@pytest.mark.parametrize(("units", "rows"), [(7, 3), (10, 10), (5, 12)])
def test_each_pass_takes_every_unit_once_in_a_seeded_order(units: int, rows: int) -> None:
    walked = epoch_units(4, units, 0, 3 * units)
    passes = [walked[n * units : (n + 1) * units] for n in range(3)]
    assert all(sorted(p) == list(range(units)) for p in passes)
    assert passes[0] != passes[1] or units < 3  # each pass its own order
    # any stretch is the same rows however it is asked for (a batch, a micro-batch, a resume)
    pieces = [epoch_units(4, units, start, rows) for start in range(0, 3 * units, rows)]
    assert [u for piece in pieces for u in piece][: 3 * units] == walked
    assert epoch_units(5, units, 0, units) != passes[0] or units < 3  # the seed chooses the order


def test_train_epochs_derives_the_steps_and_the_batches_walk_the_passes(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("the quick brown fox jumps over the lazy dog. " * 120)
    plan = load("dense_lm").checked_plan()
    target = Target.of("reference", seed=2)
    data = DataSettings(path=str(tmp_path / "notes.txt"), val_fraction=0.0)
    task = LanguageTask.prepare(plan, data, target, tokens=4 * 16, seq_len=16)
    steps = task.steps_for(2.5)
    units = task.corpus.units
    assert steps == math.ceil(2.5 * units / 4)
    rows = torch.cat([task.batch(step).x for step in range(1, steps + 1)])
    starts = {tuple(r.tolist()) for r in rows[:units]}
    windows = {tuple(task.corpus.rows_of([u])[0][0].tolist()) for u in range(units)}
    assert starts == windows  # the first pass: every window of the text once
    halves = torch.cat([task.batch(3, micro, 2).x for micro in range(2)])
    assert torch.equal(halves, task.batch(3).x)  # gradient accumulation splits the same rows
    settings = TrainSettings(epochs=2.5, steps=7, out_dir=str(tmp_path / "run"), plot=False, loggers=[])
    settings = settings.for_task(True)
    done = train(
        plan, target, TrainSettings(**{**settings.__dict__, "batch_tokens": 64, "seq_len": 16}), data=data
    )
    assert done.last_step == steps  # train.steps is not read
    assert len(read_records(tmp_path / "run" / "metrics.jsonl")) == steps


def test_train_epochs_on_a_model_without_data_is_refused() -> None:
    settings = TrainSettings(epochs=1, plot=False, loggers=[])
    with pytest.raises(ConfigError, match=r"train\.epochs"):
        train(load("residual_mlp").checked_plan(), "reference", settings)


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's folder: a tiny Llama made by transformers with a word-level tokenizer and a ChatML
    template (``hf``), conversations (``chat.jsonl``) and preference pairs (``pairs.jsonl``)."""
    pytest.importorskip("transformers", reason="a checkpoint made by transformers (dev extra)")
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tests.hf.tiny import make
    from tests.language.test_chat import CHATML

    where = tmp_path_factory.mktemp("fine-tune-user")
    source = make("llama", where / "hf")
    words = ["[UNK]", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "system", "user", "assistant"]
    words += ["hello", "there", "what", "is", "it", "You", "are", "a", "helpful", "AI", "named", "SmolLM,"]
    words += ["yes", "no", "blue", "sky", "the"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    (source / "tokenizer.json").write_text(backend.to_str())
    (source / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": CHATML, "eos_token": "<|im_end|>"})
    )
    answers = ["yes", "no", "the blue sky", "it is blue"]
    lines = [
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": f"what is it {n}"},
                    {"role": "assistant", "content": answers[n % 4]},
                ]
            }
        )
        for n in range(24)
    ]
    (where / "chat.jsonl").write_text("\n".join(lines) + "\n")
    turns = [json.loads(line)["messages"] for line in lines]
    pairs = [
        {"prompt": [turn[0]], "chosen": [turn[1]], "rejected": [{"role": "assistant", "content": "no"}]}
        for turn in turns
    ]
    (where / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    return where


def test_the_guides_commands_run_as_written(user_folder: Path) -> None:
    imported, full, lora, export, dpo = (
        block_after("guides/fine-tuning.md", "One command each", "bash").strip().splitlines()
    )
    done = user_cli(user_folder, *shlex.split(imported.replace("path/to/checkpoint", "hf"))[3:])
    assert done.returncode == 0, done.stderr
    runs: dict[str, Path] = {}
    for name, line in (("full", full), ("lora", lora), ("dpo", dpo)):
        before = (
            set((user_folder / "outputs" / "mine").glob("*")) if (user_folder / "outputs").exists() else set()
        )
        done = user_cli(user_folder, *shlex.split(line)[3:])
        assert done.returncode == 0, done.stdout + done.stderr
        (runs[name],) = set((user_folder / "outputs" / "mine").glob("*")) - before
        assert "train.epochs=1:" in done.stdout
        config = (runs[name] / "config.yaml").read_text()
        assert {"full": "lr: 2.0e-05", "lora": "lr: 0.0002", "dpo": "lr: 1.0e-06"}[name] in config
    export_line = re.sub(r"outputs/mine/<date>_<time>", f"outputs/mine/{runs['lora'].name}", export)
    done = user_cli(user_folder, *shlex.split(export_line)[3:])
    assert done.returncode == 0, done.stderr
    adapter = json.loads((user_folder / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 16 and adapter["lora_alpha"] == 32.0
    first = json.loads((runs["dpo"] / "metrics.jsonl").read_text().splitlines()[0])
    assert first["terms"] == {"dpo": pytest.approx(math.log(2), rel=1e-6)}  # the policy is its reference
