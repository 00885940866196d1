"""Nothing silently wrong in the data a model is trained and used with: the token cache verifies what it
holds and is built once however many runs want it at once; globs terminate and read each file once; a
model records the tokenizer it was trained with and refuses another; an export keeps everything its
source had (context length, special token ids, generation config, tokenizer files), through
``train.init_from`` and a resume."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import te_assembly
from te_assembly.data.cache import prepare
from te_assembly.data.settings import DataSettings, TokenizerSettings
from te_assembly.data.sources import documents, find_sources
from te_assembly.errors import DataError
from te_assembly.formats.hf.convert import export_hf
from te_assembly.jobs.train.settings import TrainSettings
from tests.conftest import REPO_ROOT

TEXT = "The quick brown fox jumps over the lazy dog. " * 40


def _corpus(folder: Path, files: int = 4) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (folder / f"doc{i}.txt").write_text(f"document {i}. " + TEXT)
    return folder


def test_a_same_length_edit_to_the_cache_is_found_and_never_trained_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = DataSettings(path=str(_corpus(tmp_path / "corpus")), cache_dir=str(tmp_path / "cache"))
    first = prepare(settings)
    assert first.directory is not None
    expected = np.array(first.train).copy()
    train_bin = first.directory / "train.bin"
    stat = train_bin.stat()
    data = bytearray(train_bin.read_bytes())
    data[10] ^= 0x01  # same length, same times: only the content differs
    del first
    train_bin.write_bytes(bytes(data))
    os.utime(train_bin, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with caplog.at_level(logging.WARNING):
        again = prepare(settings)
    assert np.array_equal(np.array(again.train), expected)
    assert "does not match its checksums" in caplog.text


def _flip_keeping_times(path: Path) -> None:
    """One byte changed, size and times as they were (an edit in the clock tick the entry was written in
    looks the same to a check of times)."""
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _edit_meta(entry: Path, **changes: Any) -> None:
    meta = json.loads((entry / "meta.json").read_text())
    meta.update(changes)
    (entry / "meta.json").write_text(json.dumps(meta, indent=1))


def _signed_meta(entry: Path, **changes: Any) -> None:
    """meta.json edited and its own digest made again: only the checks of its values are left."""
    from te_assembly.data.cache import _meta_digest

    meta = json.loads((entry / "meta.json").read_text())
    meta.update(changes)
    meta["meta_sha256"] = _meta_digest(meta)
    (entry / "meta.json").write_text(json.dumps(meta, indent=1))


CACHE_EDITS = {
    "train.bin, times kept": lambda e: _flip_keeping_times(e / "train.bin"),
    "val.bin, times kept": lambda e: _flip_keeping_times(e / "val.bin"),
    "meta.json's dtype (same width)": lambda e: _edit_meta(e, dtype="int16"),
    "meta.json's counts": lambda e: _edit_meta(e, tokens={"train": 10, "val": 2}),
    "meta.json's dtype, digest made again": lambda e: _signed_meta(e, dtype="int16"),
    "meta.json moved to another entry": lambda e: _signed_meta(e, key="0" * 32),
}


@pytest.mark.parametrize("edit", CACHE_EDITS, ids=list(CACHE_EDITS))
def test_every_edit_of_an_entry_is_found_each_time_it_is_opened(
    edit: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = DataSettings(path=str(_corpus(tmp_path / "corpus")), cache_dir=str(tmp_path / "cache"))
    first = prepare(settings)
    assert first.directory is not None
    train, val = np.array(first.train).copy(), np.array(first.val).copy()
    prepare(settings)  # opened once more unchanged: whatever a check of times would remember, it has
    CACHE_EDITS[edit](first.directory)
    del first
    with caplog.at_level(logging.WARNING):
        again = prepare(settings)
    assert "does not match its checksums" in caplog.text
    assert np.array_equal(np.array(again.train), train) and np.array_equal(np.array(again.val), val)
    assert np.array(again.train).dtype == np.uint16


def test_resume_and_eval_open_the_cache_through_the_same_check(tmp_path: Path) -> None:
    """A run stopped half-way, its cache edited (meta.json's dtype), resumed: the same losses as the
    uninterrupted run; ``eval`` on the edited cache scores what it scores on a clean one."""
    from te_assembly.jobs.eval.job import evaluate
    from te_assembly.jobs.eval.settings import EvalSettings

    settings = DataSettings(path=str(_corpus(tmp_path / "corpus")), cache_dir=str(tmp_path / "cache"))
    plan = te_assembly.load("dense_lm").checked_plan()

    def train(out: Path, **changes: Any) -> list[float]:
        run = TrainSettings(
            steps=4, batch_tokens=2 * 32, seq_len=32, eval_every=0, plot=False, out_dir=str(out), **changes
        )  # type: ignore[arg-type]
        te_assembly.train(plan, "reference", run, data=settings)
        return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]

    whole = train(tmp_path / "whole", checkpoint_every=2)
    train(tmp_path / "half", checkpoint_every=2, stop_after=2)
    entry = prepare(settings).directory
    assert entry is not None
    _edit_meta(entry, dtype="int16")
    assert train(tmp_path / "half", checkpoint_every=2, resume=True) == whole
    clean = evaluate(tmp_path / "whole", "reference", settings, EvalSettings(seq_len=32, batch=2))
    _signed_meta(entry, dtype="int16")
    edited = evaluate(tmp_path / "whole", "reference", settings, EvalSettings(seq_len=32, batch=2))
    assert edited.loss == clean.loss and edited.tokens == clean.tokens


PREPARE = """
import sys, time
from pathlib import Path
import te_assembly
from te_assembly.data.cache import prepare
from te_assembly.data.settings import DataSettings
start = float(sys.argv[3])
while time.time() < start:
    time.sleep(0.005)
found = prepare(DataSettings(path=sys.argv[1], cache_dir=sys.argv[2]))
print(found.directory, len(found.train))
"""


def test_runs_started_together_on_an_uncached_corpus_all_get_it(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "corpus", files=40)
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    start = time.time() + 4
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PREPARE, str(corpus), str(cache), str(start)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    for proc, (_, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
    assert len({out for out, _ in results}) == 1  # one entry, the same ids for every run
    entries = (
        [p for p in (cache / "tokens").iterdir() if p.is_dir()]
        if (cache / "tokens").is_dir()
        else [p for p in cache.iterdir() if p.is_dir()]
    )
    assert len(entries) == 1, entries


def test_a_glob_through_a_symlink_loop_ends_and_reads_each_file_once(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "corpus", files=2)
    (corpus / "loop").symlink_to("..")
    (corpus / "loop2").symlink_to(".")
    settings = DataSettings(path=str(tmp_path / "corpus" / "**" / "*.txt"))
    found = find_sources(settings)
    assert [p.name for p in found.files] == ["doc0.txt", "doc1.txt"]
    assert len(list(documents(found, settings))) == 2


def test_a_file_reached_twice_is_read_once(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "corpus", files=1)
    (corpus / "same.txt").symlink_to("doc0.txt")
    settings = DataSettings(path=str(corpus))
    assert len(list(documents(find_sources(settings), settings))) == 1


# --- the tokenizer a model was trained with ----------------------------------------------------------


def _word_tokenizer(path: Path, words: list[str]) -> Path:
    """A tiny WordLevel ``tokenizer.json`` (ids below a tiny model's vocabulary)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[UNK]", "<|endoftext|>", *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path.write_text(tok.to_str())
    return path


def _lm() -> Any:
    return te_assembly.load("dense_lm", ["model.dims.layers=1", "model.dims.hidden=32"]).checked_plan()


def test_generate_refuses_a_tokenizer_the_model_was_not_trained_with(tmp_path: Path) -> None:
    data = DataSettings(path=str(_corpus(tmp_path / "corpus")), cache_dir=str(tmp_path / "cache"))
    settings = TrainSettings(steps=1, batch_tokens=128, seq_len=32, out_dir=str(tmp_path / "run"), plot=False)
    te_assembly.train(_lm(), "reference", settings, data=data)
    pre = te_assembly.export_checkpoint(tmp_path / "run", tmp_path / "pre")
    _word_tokenizer(pre / "tokenizer.json", ["the", "fox"])  # a foreign file beside a byte-level model
    prompt = te_assembly.GenerateSettings(prompt="the fox", max_new_tokens=2)
    with pytest.raises(DataError, match="trained with the byte-level tokenizer") as refused:
        te_assembly.generate(str(pre), "reference", prompt)
    assert "give it no tokenizer" in str(refused.value)  # the fix, said once
    (pre / "tokenizer.json").unlink()
    assert te_assembly.generate(str(pre), "reference", prompt).ids


def test_a_tokenizer_with_an_id_past_uint16_is_stored_by_its_largest_id(tmp_path: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "<|endoftext|>": 1, "fox": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    data = json.loads(tok.to_str())
    data["added_tokens"] = [
        {
            **json.loads(
                json.dumps(
                    {
                        "id": 70000,
                        "content": "<big>",
                        "single_word": False,
                        "lstrip": False,
                        "rstrip": False,
                        "normalized": False,
                        "special": True,
                    }
                )
            )
        }
    ]
    data["model"]["vocab"]["<big>"] = 70000
    (tmp_path / "tok.json").write_text(json.dumps(data))
    del AddedToken
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("fox <big> fox " * 50)
    settings = DataSettings(
        path=str(tmp_path / "corpus"),
        cache_dir=str(tmp_path / "cache"),
        tokenizer=TokenizerSettings(path=str(tmp_path / "tok.json")),
    )
    found = prepare(settings)
    assert found.tokenizer.vocab_size == 70001
    assert int(max(np.max(found.train, initial=0), np.max(found.val, initial=0))) == 70000


def test_a_tokenizer_that_cannot_tokenize_is_a_data_error(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"<|endoftext|>": 0, "fox": 1}, unk_token="[UNK]"))  # no [UNK] id
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    (tmp_path / "tok.json").write_text(tok.to_str())
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("fox dog " * 50)
    settings = DataSettings(
        path=str(tmp_path / "corpus"),
        cache_dir=str(tmp_path / "cache"),
        tokenizer=TokenizerSettings(path=str(tmp_path / "tok.json")),
    )
    with pytest.raises(DataError, match="cannot tokenize"):
        prepare(settings)


def test_a_damaged_cached_bpe_is_made_again(tmp_path: Path) -> None:
    settings = DataSettings(
        path=str(_corpus(tmp_path / "corpus")),
        cache_dir=str(tmp_path / "cache"),
        tokenizer=TokenizerSettings(train_vocab=300),
    )
    first = prepare(settings)
    assert first.directory is not None
    ids = np.array(first.train).copy()
    (first.directory / "tokenizer.json").write_text('{"model": "not a tokenizer"')
    again = prepare(settings)
    assert np.array_equal(np.array(again.train), ids)


# --- exports keep what their source had --------------------------------------------------------------


def _imported_with_tokenizer(hf_llama: Path, tmp_path: Path, words: list[str]) -> Path:
    source = tmp_path / "hf"
    shutil.copytree(hf_llama, source)
    _word_tokenizer(source / "tokenizer.json", words)
    return source


def _train_imported(imported: Path, tmp_path: Path, tokenizer: Path, **changes: Any) -> Any:
    plan = te_assembly.load("imported", config_dirs=[imported]).checked_plan()
    data = DataSettings(
        path=str(tmp_path / "corpus"),
        cache_dir=str(tmp_path / "cache"),
        tokenizer=TokenizerSettings(path=str(tokenizer)),
    )
    settings = TrainSettings(
        steps=2,
        batch_tokens=64,
        seq_len=16,
        out_dir=str(tmp_path / "run"),
        init_from=str(imported),
        plot=False,
    )
    return te_assembly.train(plan, "reference", dataclasses.replace(settings, **changes), data=data)


def test_an_export_keeps_what_the_import_had_through_init_from_and_resume(
    hf_llama: Path, tmp_path: Path
) -> None:
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog."]
    source = _imported_with_tokenizer(hf_llama, tmp_path, words)
    (source / "tokenizer_config.json").write_text(
        json.dumps({"model_max_length": 256, "eos_token": "<|endoftext|>"})
    )
    generation = {"bos_token_id": 1, "eos_token_id": 1, "do_sample": False, "max_new_tokens": 17}
    (source / "generation_config.json").write_text(json.dumps(generation))
    config = json.loads((source / "config.json").read_text())
    config.update(max_position_embeddings=256, bos_token_id=1, eos_token_id=1)
    (source / "config.json").write_text(json.dumps(config))
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("the quick brown fox jumps over the lazy dog. " * 80)
    imported = te_assembly.import_hf(source, tmp_path / "imported")
    _train_imported(imported, tmp_path, imported / "tokenizer.json")
    for resumed in (False, True):
        if resumed:
            _train_imported(imported, tmp_path, imported / "tokenizer.json", steps=3, resume=True)
        out = export_hf(tmp_path / "run", tmp_path / f"out-{resumed}")
        written = json.loads((out / "config.json").read_text())
        assert written["max_position_embeddings"] == 256
        assert written["bos_token_id"] == 1 and written["eos_token_id"] == 1
        assert json.loads((out / "generation_config.json").read_text()) == generation
        assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == 256
        assert (out / "tokenizer.json").is_file()


def test_init_from_refuses_data_of_another_tokenizer(hf_llama: Path, tmp_path: Path) -> None:
    imported = te_assembly.import_hf(
        _imported_with_tokenizer(hf_llama, tmp_path, ["the", "fox"]), tmp_path / "imported"
    )
    other = _word_tokenizer(tmp_path / "other.json", ["a", "dog"])
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("a dog " * 2000)
    with pytest.raises(DataError, match=r"train\.init_from=.*was trained with a tokenizer\.json") as refused:
        _train_imported(imported, tmp_path, other, steps=1)
    assert f"use {imported / 'tokenizer.json'} (" in str(refused.value)
    assert str(refused.value).count("tokenizer.json of fingerprint") == 2  # the two, each named once
    assert not (tmp_path / "run").exists()
