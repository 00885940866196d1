"""Training a language model on text, exact resume, the data in the run record, and generate."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch

import te_assembly
from te_assembly.data.settings import DataSettings
from te_assembly.data.tokenizer import ByteTokenizer
from te_assembly.engines.target import Target
from te_assembly.errors import CheckpointError
from te_assembly.jobs.generate.job import generate, next_token
from te_assembly.jobs.generate.settings import GenerateSettings
from te_assembly.jobs.train.job import train
from te_assembly.jobs.train.settings import TrainSettings
from tests.language.lm import tiny_lm

CORPUS = "abcabcabd abcabcabd " * 60


def _data(tmp_path: Path, text: str = CORPUS) -> DataSettings:
    src = tmp_path / "corpus"
    src.mkdir(exist_ok=True)
    for i in range(8):
        (src / f"d{i}.txt").write_text(text)
    return DataSettings(path=str(src), cache_dir=str(tmp_path / "cache"))


def _settings(out: Path, **kw: object) -> TrainSettings:
    base = dict(steps=60, batch_tokens=256, seq_len=16, lr=1e-2, warmup_steps=2, plot=False, out_dir=str(out))
    base.update(kw)
    return TrainSettings(**base)  # type: ignore[arg-type]


def _unigram_entropy(text: str) -> float:
    counts = Counter(text.encode())
    total = sum(counts.values())
    return -sum(c / total * math.log(c / total) for c in counts.values())


def test_a_tiny_model_learns_below_the_unigram_entropy_and_logs_validation(tmp_path: Path) -> None:
    plan = te_assembly.load(tiny_lm(vocab=272)).checked_plan()
    result = train(plan, "reference", _settings(tmp_path / "run", eval_every=20), data=_data(tmp_path))
    entropy = _unigram_entropy(CORPUS)
    assert result.losses[0] > entropy  # starts at about ln(272)
    assert result.losses[-1] < entropy
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evaluated = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in evaluated] == [20, 40, 60]
    assert evaluated[-1]["val_loss"] < evaluated[0]["val_loss"]
    assert evaluated[-1]["val_perplexity"] == pytest.approx(math.exp(evaluated[-1]["val_loss"]))
    assert evaluated[-1]["val_bits_per_byte"] is not None


def test_resume_is_exact_and_other_data_is_another_run(tmp_path: Path) -> None:
    plan = te_assembly.load(tiny_lm(vocab=272)).checked_plan()
    data = _data(tmp_path)
    straight = train(
        plan, "reference", _settings(tmp_path / "a", steps=8, grad_accum=2, clip_grad_norm=0.5), data=data
    )
    train(
        plan,
        "reference",
        _settings(tmp_path / "b", steps=8, stop_after=4, grad_accum=2, clip_grad_norm=0.5),
        data=data,
    )
    resumed = train(
        plan,
        "reference",
        _settings(tmp_path / "b", steps=8, resume=True, grad_accum=2, clip_grad_norm=0.5),
        data=data,
    )
    assert resumed.start_step == 4
    assert resumed.losses == straight.losses
    other = (
        _data(tmp_path / "other_text", "xyz xyz " * 200)
        if (tmp_path / "other_text").mkdir() is None
        else None
    )
    assert other is not None
    with pytest.raises(CheckpointError, match="data"):
        train(
            plan,
            "reference",
            _settings(tmp_path / "b", steps=10, resume=True, grad_accum=2, clip_grad_norm=0.5),
            data=other,
        )


def test_generate_is_deterministic_and_greedy_is_the_models_own_argmax() -> None:
    torch.manual_seed(0)
    model = te_assembly.build(tiny_lm(vocab=272, attention=True), "reference")
    tok = ByteTokenizer()
    sampled = GenerateSettings(prompt="ab", max_new_tokens=12, temperature=1.0, seed=5, stop_at_eot=False)
    here = Target(model.engine)
    first = generate(model, here, sampled, tokenizer=tok)
    assert generate(model, here, sampled, tokenizer=tok).ids == first.ids
    assert (
        generate(
            model,
            here,
            GenerateSettings(prompt="ab", max_new_tokens=12, temperature=1.0, seed=6),
            tokenizer=tok,
        ).ids
        != first.ids
    )
    greedy = generate(
        model,
        here,
        GenerateSettings(prompt="ab", max_new_tokens=6, temperature=0, stop_at_eot=False),
        tokenizer=tok,
    )
    ids = tok.encode("ab")
    for _ in range(6):
        ids.append(int(model(torch.tensor([ids])).y[0, -1].argmax()))
    assert greedy.ids == ids[2:]


def test_top_k_and_top_p_keep_only_the_likely_ids() -> None:
    logits = torch.tensor([5.0, 4.0, 0.0, -1.0, -2.0])
    drawn = {
        next_token(
            logits, GenerateSettings(temperature=1.0, top_k=2, top_p=None), torch.Generator().manual_seed(s)
        )
        for s in range(200)
    }
    assert drawn == {0, 1}
    nucleus = {
        next_token(
            logits, GenerateSettings(temperature=1.0, top_k=None, top_p=0.5), torch.Generator().manual_seed(s)
        )
        for s in range(50)
    }
    assert nucleus == {0}  # id 0 alone holds more than half the probability


@pytest.mark.te
def test_generate_through_tes_fusers_equals_the_reference_engine() -> None:
    pytest.importorskip("transformer_engine.pytorch", reason="needs Transformer Engine")
    from te_assembly.engines.weights import copy_weights

    torch.manual_seed(0)
    ref = te_assembly.build(tiny_lm(vocab=272, attention=True), "reference")
    te = te_assembly.build(tiny_lm(vocab=272, attention=True), Target.of("te", kernels="reference"))
    copy_weights(ref, te)
    settings = GenerateSettings(prompt="ab", max_new_tokens=10, temperature=0.9, seed=3, stop_at_eot=False)
    assert (
        generate(te, Target(te.engine), settings, tokenizer=ByteTokenizer()).ids
        == generate(ref, Target(ref.engine), settings, tokenizer=ByteTokenizer()).ids
    )


def test_run_on_a_language_model_computes_the_next_token_cross_entropy() -> None:
    plan = te_assembly.load(tiny_lm(vocab=272)).checked_plan()
    target = te_assembly.Target.of("reference", seed=0)
    result = te_assembly.run(plan, target, te_assembly.RunSettings(steps=1, tokens=64, seq_len=8))
    # A fresh tied model's logits are near zero, so the cross-entropy is near ln(vocab) (mean(y^2) is ~0).
    assert result.loss == pytest.approx(math.log(272), abs=0.05)


def test_the_loss_in_chunks_trains_as_the_logits_whole_from_the_command_line(tmp_path: Path) -> None:
    """``train.loss_chunk_tokens`` (default 1024) against ``null``, with the z-loss on, from a folder of
    the user's own: the same losses and validation losses, step by step (float32: summed in another
    order); 0 is refused at its key before anything runs."""
    from tests.conftest import user_cli

    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text(CORPUS)
    common = ("train", "model=llama_tiny", "data.path=notes", "train.steps=3", "train.eval_every=3")
    common += ("train.batch_tokens=512", "train.seq_len=32", "train.z_loss=0.01", "train.plot=false")
    env = {"TE_ASSEMBLY_CACHE": str(tmp_path / "cache")}
    runs = {}
    for name, chunk in (("whole", "null"), ("chunks", "100")):
        done = user_cli(
            tmp_path, *common, f"train.out_dir={name}", f"train.loss_chunk_tokens={chunk}", env=env
        )
        assert done.returncode == 0, done.stderr
        runs[name] = [
            json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        ]
    for whole, chunks in zip(runs["whole"], runs["chunks"], strict=True):
        assert chunks["loss"] == pytest.approx(whole["loss"], rel=2e-6)
        assert ("val_loss" in chunks) == ("val_loss" in whole)
        assert chunks.get("val_loss", 0.0) == pytest.approx(whole.get("val_loss", 0.0), rel=2e-6)
        assert chunks["terms"]["z_loss"] == pytest.approx(whole["terms"]["z_loss"], rel=2e-6)
    assert "val_loss" in runs["whole"][-1]
    refused = user_cli(tmp_path, *common, "train.loss_chunk_tokens=0", env=env)
    assert refused.returncode == 2 and "train.loss_chunk_tokens" in refused.stderr
