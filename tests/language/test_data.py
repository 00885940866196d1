"""Tokenizers, sources, the tokenized cache, batches, the cross-entropy objective, and every bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from te_assembly.data.cache import prepare
from te_assembly.data.corpus import Corpus
from te_assembly.data.settings import DataSettings, TokenizerSettings
from te_assembly.data.tokenizer import ByteTokenizer, load_tokenizer_file, train_bpe
from te_assembly.errors import DataError
from te_assembly.jobs import objective

TEXT = "Grüße, 世界! def f(x):\n    return x * 2\n"


def _folder(tmp_path: Path, docs: int = 12) -> Path:
    folder = tmp_path / "notes"
    folder.mkdir()
    for i in range(docs):
        (folder / f"n{i}.txt").write_text(
            f"note {i}: " + "the quick brown fox jumps over the lazy dog. " * (3 + i)
        )
    return folder


def _settings(tmp_path: Path, path: Path | str, **kw: object) -> DataSettings:
    return DataSettings(path=str(path), cache_dir=str(tmp_path / "cache"), **kw)  # type: ignore[arg-type]


def test_byte_level_round_trips_any_text() -> None:
    tok = ByteTokenizer()
    ids = tok.encode(TEXT)
    assert max(ids) < 256 and tok.eot_id == 256 and tok.vocab_size == 257
    assert tok.decode(ids) == TEXT


def test_a_bpe_trained_on_the_corpus_round_trips_and_saves(tmp_path: Path) -> None:
    tok = train_bpe([TEXT * 20, "hello world " * 50], 300, "<|endoftext|>")
    ids = tok.encode(TEXT)
    assert tok.decode(ids) == TEXT
    assert len(ids) < len(TEXT.encode())  # merges were learned
    saved = tok.save(tmp_path / "tokenizer.json")
    assert saved is not None
    again = load_tokenizer_file(saved, "<|endoftext|>")
    assert again.encode(TEXT) == ids and again.fingerprint == tok.fingerprint


def test_the_split_is_by_document_and_deterministic(tmp_path: Path) -> None:
    data = prepare(_settings(tmp_path, _folder(tmp_path), val_fraction=0.3))
    assert data.meta["documents"]["train"] + data.meta["documents"]["val"] == 12
    assert data.meta["documents"]["val"] >= 1
    eot = data.tokenizer.eot_id
    assert int((np.asarray(data.train) == eot).sum()) == data.meta["documents"]["train"]  # one per document
    again = prepare(_settings(tmp_path, tmp_path / "notes", val_fraction=0.3))
    assert again.directory == data.directory
    assert np.array_equal(np.asarray(again.val), np.asarray(data.val))


def test_the_cache_is_reused_and_a_changed_file_invalidates_it(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    first = prepare(_settings(tmp_path, folder))
    assert first.directory is not None
    stamp = (first.directory / "train.bin").stat().st_mtime_ns
    assert prepare(_settings(tmp_path, folder)).directory == first.directory
    assert (first.directory / "train.bin").stat().st_mtime_ns == stamp  # read back, not rewritten
    (folder / "n3.txt").write_text("changed " * 40)
    changed = prepare(_settings(tmp_path, folder))
    assert changed.directory != first.directory
    other_tokenizer = prepare(_settings(tmp_path, folder, tokenizer=TokenizerSettings(train_vocab=300)))
    assert other_tokenizer.directory not in (first.directory, changed.directory)
    assert other_tokenizer.tokenizer.kind == "bpe"


def test_json_lines_and_pretokenized_files(tmp_path: Path) -> None:
    lines = tmp_path / "docs.jsonl"
    lines.write_text("\n".join(json.dumps({"body": f"document {i} " * 20}) for i in range(6)))
    data = prepare(_settings(tmp_path, lines, text_field="body"))
    assert data.meta["documents"]["train"] + data.meta["documents"]["val"] == 6
    folder = tmp_path / "bins"
    folder.mkdir()
    np.arange(1000, dtype=np.uint16).tofile(folder / "train.bin")
    np.arange(100, dtype=np.uint16).tofile(folder / "val.bin")
    ids = prepare(_settings(tmp_path, folder))
    assert len(ids.train) == 1000 and len(ids.val) == 100 and ids.directory is None


def test_batches_are_a_pure_function_of_seed_and_step(tmp_path: Path) -> None:
    corpus = Corpus(prepare(_settings(tmp_path, _folder(tmp_path))), seq_len=16)
    x, labels = corpus.batch(seed=3, step=7, sequences=4)
    x2, labels2 = corpus.batch(seed=3, step=7, sequences=4)
    assert torch.equal(x, x2) and torch.equal(labels, labels2)
    assert x.shape == (4, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], labels[:, :-1])  # labels are the next tokens
    assert not torch.equal(corpus.batch(seed=3, step=8, sequences=4)[0], x)


def _no_cache_written(tmp_path: Path) -> bool:
    cache = tmp_path / "cache"
    return not cache.exists() or not any(cache.iterdir())


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda p: p / "missing", "no such file or folder"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "holds no file ending in"),
        (lambda p: ((p / "e.txt").write_text("") and p / "e.txt") or p / "e.txt", "holds no text"),
        (lambda p: (p / "b.txt").write_bytes(b"abc\0def") and p / "b.txt", r"b\.txt is a binary file"),
        (
            lambda p: (p / "l.txt").write_bytes(b"caf\xe9\n") and p / "l.txt",
            r"l\.txt is not UTF-8 text: byte 3",
        ),
        (
            lambda p: (p / "d.jsonl").write_text('{"x": 1}\n') and p / "d.jsonl",
            r"d\.jsonl:1 has no 'text' field",
        ),
        (lambda p: p / "*.none", "the pattern matches no file"),
    ],
)
def test_bad_sources_are_refused_naming_the_file_and_nothing_is_written(tmp_path: Path, make, match) -> None:
    path = make(tmp_path)
    with pytest.raises(DataError, match=match):
        prepare(_settings(tmp_path, path))
    assert _no_cache_written(tmp_path)


def test_a_corpus_shorter_than_a_sequence_and_a_small_vocabulary_are_refused(tmp_path: Path) -> None:
    (tmp_path / "short.txt").write_text("tiny")
    corpus = Corpus(prepare(_settings(tmp_path, tmp_path / "short.txt", val_fraction=0.0)), seq_len=64)
    with pytest.raises(DataError, match=r"fewer than one sequence of train\.seq_len=64"):
        corpus.check_fits(272, "m")
    with pytest.raises(DataError, match=r"model\.dims\.vocab=272"):
        Corpus(corpus.data, seq_len=2).check_fits(100, "m")


def test_cross_entropy_equals_a_hand_computation_with_ignore_index_and_z_loss() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=g, dtype=torch.float64)
    labels = torch.tensor([[1, 4, objective.IGNORE_INDEX], [0, objective.IGNORE_INDEX, 2]])
    aux = torch.tensor(0.25, dtype=torch.float64)
    terms = objective.next_token_terms(logits, labels, {"aux": aux}, ("aux",), z_loss=1e-2)
    kept = [(b, s) for b in range(2) for s in range(3) if labels[b, s] != objective.IGNORE_INDEX]
    ce = z = 0.0
    for b, s in kept:
        row = logits[b, s].tolist()
        lse = math.log(sum(math.exp(v) for v in row))
        ce += lse - row[int(labels[b, s])]
        z += lse**2
    assert terms[objective.CROSS_ENTROPY].item() == pytest.approx(ce / len(kept), rel=1e-12)
    assert terms[objective.Z_LOSS].item() == pytest.approx(1e-2 * z / len(kept), rel=1e-12)
    assert objective.total(terms).item() == pytest.approx(ce / len(kept) + 1e-2 * z / len(kept) + 0.25)
    # bfloat16 logits: the loss is computed in float32 all the same
    assert (
        objective.next_token_terms(logits.bfloat16(), labels, {}, ())[objective.CROSS_ENTROPY].dtype
        == torch.float32
    )


@pytest.mark.gpu
def test_te_fused_cross_entropy_agrees_with_torch() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (TE's fused cross-entropy is a Triton kernel)")
    pytest.importorskip("transformer_engine.pytorch", reason="needs Transformer Engine")
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 64, 1000, generator=g).cuda().requires_grad_()
    labels = torch.randint(0, 1000, (4, 64), generator=g).cuda()
    labels[0, :5] = objective.IGNORE_INDEX
    fused = objective.next_token_terms(logits, labels, {}, (), fused=True)[objective.CROSS_ENTROPY]
    (grad_fused,) = torch.autograd.grad(fused, logits)
    plain = objective.next_token_terms(logits, labels, {}, ())[objective.CROSS_ENTROPY]
    (grad_plain,) = torch.autograd.grad(plain, logits)
    assert torch.allclose(fused, plain, rtol=1e-5)
    assert torch.allclose(grad_fused, grad_plain, rtol=1e-4, atol=1e-7)


def test_a_datasets_dataset_saved_to_disk(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets", reason="the optional extra te_assembly[datasets]")
    rows = [f"row {i}: " + "lorem ipsum dolor sit amet " * 4 for i in range(10)]
    splits = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"body": rows[:8]}),
            "test": datasets.Dataset.from_dict({"body": rows[8:]}),
        }
    )
    splits.save_to_disk(str(tmp_path / "ds"))
    data = prepare(_settings(tmp_path, tmp_path / "ds", text_field="body"))
    assert data.meta["documents"]["train"] + data.meta["documents"]["val"] == 10
    assert sum(len(r.encode()) for r in rows) == data.meta["bytes"]["train"] + data.meta["bytes"]["val"]
    with pytest.raises(DataError, match="has no column 'text'"):
        prepare(_settings(tmp_path, tmp_path / "ds"))


def test_pretokenized_ids_beyond_the_vocabulary_are_refused(tmp_path: Path) -> None:
    ids = np.arange(2000, dtype=np.uint16) % 300  # ids up to 299
    ids.tofile(tmp_path / "tokens.bin")
    corpus = Corpus(prepare(_settings(tmp_path, tmp_path / "tokens.bin")), seq_len=16)
    with pytest.raises(DataError, match="token ids up to 299 would be out of range"):
        corpus.check_fits(272, "dense_lm")
    corpus.check_fits(304, "dense_lm")  # a vocabulary that holds them


def test_a_single_document_is_split_by_position_whatever_its_name(tmp_path: Path) -> None:
    """One document goes to training and is held out by position; it used to be lost to both splits
    when its name hashed into the validation fraction (about one name in 20)."""
    from te_assembly.data.cache import is_validation

    names = [f"doc{i}.txt" for i in range(1000)]
    held_out = next(n for n in names if is_validation(n, 0.05))
    kept = next(n for n in names if not is_validation(n, 0.05))
    for name in (held_out, kept):
        folder = tmp_path / name.removesuffix(".txt")
        folder.mkdir()
        (folder / name).write_text("one document of plain words. " * 200)  # 5,800 bytes
        data = prepare(DataSettings(path=str(folder / name), cache_dir=str(tmp_path / "cache")))
        total = len(data.train) + len(data.val)
        assert total >= 5800
        assert len(data.val) == max(1, int(total * 0.05))
        assert len(data.train) == total - len(data.val)
