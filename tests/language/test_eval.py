"""``eval``: every token scored exactly once with the context the windows promise; the score equal to a
cross-entropy computed with transformers' own model on the same windows; the command as a new user runs
it (an imported checkpoint, a text folder, ``eval.json``), and what it refuses."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from te_assembly.jobs.eval.job import IGNORE, score, windows
from tests.conftest import user_cli


@settings(max_examples=200, deadline=None)
@given(length=st.integers(2, 400), seq_len=st.integers(2, 64), data=st.data())
def test_every_target_is_scored_once_with_its_promised_context(
    length: int, seq_len: int, data: st.DataObject
) -> None:
    stride = data.draw(st.integers(1, seq_len))
    scored: list[int] = []
    for number, (begin, end, skip) in enumerate(windows(length, seq_len, stride)):
        assert 0 <= begin < end <= length - 1 and end - begin <= seq_len
        targets = list(range(begin + 1 + skip, end + 1))
        scored += targets
        if number:  # after the first window, each target sees at least seq_len - stride earlier tokens
            assert all(t - begin >= min(seq_len - stride, t) for t in targets)
    assert scored == list(range(1, length))


def test_a_stride_longer_than_the_window_is_refused() -> None:
    with pytest.raises(Exception, match=r"stride=9 is more than eval\.seq_len=8"):
        windows(100, 8, 9)


@pytest.mark.parametrize(("seq_len", "stride", "chunk"), [(16, 16, None), (16, 5, 7), (40, 40, 1024)])
def test_score_equals_transformers_on_the_same_windows(
    seq_len: int, stride: int, chunk: int | None, tmp_path: Path
) -> None:
    """``chunk``: the head and loss 7 tokens at a time (``eval.loss_chunk_tokens``), all at once, and
    the default."""
    from te_assembly.engines.target import Target
    from te_assembly.formats.hf.convert import from_hf
    from te_assembly.jobs.verify_hf import float64_islands_removed, load_transformers
    from tests.hf.tiny import make

    source = make("qwen2", tmp_path / "hf")
    mine = from_hf(source, Target.of("reference", dtype=torch.float64))
    theirs = load_transformers(source, torch.float64)
    ids = torch.randint(0, 96, (157,), generator=torch.Generator().manual_seed(4))
    total, count, made = score(mine, ids, seq_len, stride, batch=3, chunk_tokens=chunk)
    expected, n = 0.0, 0
    with float64_islands_removed(theirs), torch.no_grad():
        for begin, end, skip in windows(len(ids), seq_len, stride):
            logits = theirs(input_ids=ids[None, begin:end]).logits[0]
            labels = ids[begin + 1 : end + 1].clone()
            labels[:skip] = IGNORE
            expected += float(
                torch.nn.functional.cross_entropy(logits, labels, ignore_index=IGNORE, reduction="sum")
            )
            n += int((labels != IGNORE).sum())
    assert (count, made) == (n, len(windows(len(ids), seq_len, stride)))
    assert count == len(ids) - 1
    assert abs(total - expected) <= 1e-10 * abs(expected)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return user_cli(cwd, *args, env={"TE_ASSEMBLY_CACHE": str(cwd / "cache")})


@pytest.mark.slow
def test_eval_command_on_an_imported_checkpoint(tmp_path: Path) -> None:
    """From a folder outside the repository: import a checkpoint, score it on a folder of text; the
    numbers printed are those in ``eval.json`` and those ``evaluate`` returns from Python."""
    from te_assembly.data.settings import DataSettings
    from te_assembly.jobs.eval.job import evaluate
    from te_assembly.jobs.eval.settings import EvalSettings
    from tests.hf.tiny import make

    make("llama", tmp_path / "tiny", changes={"vocab_size": 272})
    assert _cli("import-hf", "tiny", "mine", cwd=tmp_path).returncode == 0
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("the cat sat on the mat. " * 60)
    (tmp_path / "notes" / "b.md").write_text("# notes\nsome more words, and a few more. " * 30)
    done = _cli("eval", "mine", "data.path=notes", "eval.seq_len=64", "eval.stride=16", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (written,) = (tmp_path / "outputs" / "mine").glob("*/eval.json")
    report = json.loads(written.read_text())
    assert f"loss {report['loss']:.4f} nats/token" in done.stdout
    assert report["seq_len"] == 64 and report["stride"] == 16 and report["bits_per_byte"] > 0
    os.environ["TE_ASSEMBLY_CACHE"] = str(tmp_path / "cache")
    try:
        again = evaluate(
            tmp_path / "mine",
            "reference",
            DataSettings(path=str(tmp_path / "notes")),
            EvalSettings(seq_len=64, stride=16),
        )
    finally:
        del os.environ["TE_ASSEMBLY_CACHE"]
    assert again.loss == pytest.approx(report["loss"], rel=1e-6)
    assert again.tokens == report["tokens"]


def test_eval_without_a_source_says_what_it_needs(tmp_path: Path) -> None:
    done = _cli("eval", cwd=tmp_path)
    assert done.returncode == 2
    assert "eval needs a model to score" in done.stdout + done.stderr
    assert not (tmp_path / "outputs").exists()


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama imported from transformers: its context is 256 positions (max_position_embeddings)."""
    import te_assembly
    from tests.hf.tiny import make

    root = tmp_path_factory.mktemp("context")
    source = make("llama", root / "hf", changes={"vocab_size": 272, "max_position_embeddings": 48})
    return te_assembly.import_hf(source, root / "mine")


def test_a_window_past_the_model_s_context_is_refused_at_its_setting(imported: Path, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("the cat sat on the mat. " * 40)
    done = _cli("eval", str(imported), "data.path=notes.txt", "eval.seq_len=1000000000", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    text = done.stdout + done.stderr
    assert "eval.seq_len=1000000000 is more than mine's context of 48 positions" in text, text
    assert "use eval.seq_len=48 or less, or leave it null" in text
    done = _cli("generate", "hi", f"generate.source={imported}", "generate.context=49", cwd=tmp_path)
    assert (
        done.returncode == 2
        and "generate.context=49 is more than mine's context of 48" in done.stdout + done.stderr
    )


def test_the_window_is_the_model_s_context_unless_set(imported: Path, tmp_path: Path) -> None:
    from te_assembly.data.settings import DataSettings
    from te_assembly.jobs.eval.job import evaluate
    from te_assembly.jobs.eval.settings import EvalSettings
    from te_assembly.jobs.window import DEFAULT, window

    (tmp_path / "notes.txt").write_text("the cat sat on the mat. " * 40)
    data = DataSettings(path=str(tmp_path / "notes.txt"), cache_dir=str(tmp_path / "cache"))
    assert evaluate(imported, "reference", data, EvalSettings()).seq_len == 48
    assert evaluate(imported, "reference", data, EvalSettings(seq_len=16)).seq_len == 16
    assert window(None, imported, "generate.context", "mine") == 48
    assert window(None, tmp_path, "generate.context", "scratch") == DEFAULT  # no context recorded


def test_windows_that_cannot_fit_are_refused_before_any_forward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model with no recorded context (trained here): a window of 4,096 positions over a long text,
    with 1 MB of memory allowed, is refused naming the setting, before anything is scored."""
    import te_assembly
    from te_assembly.data.settings import DataSettings
    from te_assembly.errors import ResourceError
    from te_assembly.jobs.eval.job import evaluate
    from te_assembly.jobs.eval.settings import EvalSettings

    model = te_assembly.build("dense_lm", "reference")
    (tmp_path / "long.txt").write_text("words and more words. " * 400)
    data = DataSettings(path=str(tmp_path / "long.txt"), cache_dir=str(tmp_path / "cache"))
    monkeypatch.setenv("TE_ASSEMBLY_MEMORY_LIMIT", "1MB")
    with pytest.raises(ResourceError, match=r"window\(s\) of 4,096 positions .* lower eval\.seq_len"):
        evaluate(model, "reference", data, EvalSettings(seq_len=4096, batch=2))


def test_eval_says_when_an_instruct_model_is_scored_on_raw_text(imported: Path, tmp_path: Path) -> None:
    from tests.language.test_instructions import _instruct

    instruct, _ = _instruct(tmp_path / "instruct")
    (tmp_path / "notes.txt").write_text("What colour is the sky? Blue. " * 20)
    said = _cli("eval", str(instruct), "data.path=notes.txt", "eval.seq_len=32", cwd=tmp_path)
    assert said.returncode == 0, said.stderr
    assert "note: the model has a chat template, and this scores it on raw text" in said.stdout
    plain = _cli("eval", str(imported), "data.path=notes.txt", "eval.seq_len=32", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert "chat template" not in plain.stdout


def test_without_the_end_of_text_token_eval_scores_what_transformers_scores(tmp_path: Path) -> None:
    """One text, byte-level: ``eval.add_eot=false`` scores exactly the text's ids, as transformers'
    perplexity does (its model on the same windows); the default also scores the end-of-text token that
    training appends after each document, one target more."""
    import te_assembly
    from te_assembly.data.settings import DataSettings
    from te_assembly.jobs.eval.job import evaluate
    from te_assembly.jobs.eval.settings import EvalSettings
    from te_assembly.jobs.verify_hf import load_transformers
    from tests.hf.tiny import make

    source = make("llama", tmp_path / "hf", changes={"vocab_size": 272}, torch_dtype=torch.float64)
    model = te_assembly.from_hf(source, te_assembly.Target.of("reference", dtype=torch.float64))
    text = "the quick brown fox jumps over the lazy dog. " * 4
    (tmp_path / "one.txt").write_text(text)
    data = DataSettings(path=str(tmp_path / "one.txt"), cache_dir=str(tmp_path / "cache"))
    plain = evaluate(model, "reference", data, EvalSettings(seq_len=32, add_eot=False))
    with_eot = evaluate(model, "reference", data, EvalSettings(seq_len=32))
    ids = torch.tensor(list(text.encode()))
    theirs = load_transformers(source, torch.float64)
    total = 0.0
    with torch.no_grad():
        for begin, end, _ in windows(len(ids), 32, 32):
            logits = theirs(input_ids=ids[None, begin:end]).logits[0]
            total += float(
                torch.nn.functional.cross_entropy(logits, ids[begin + 1 : end + 1], reduction="sum")
            )
    assert plain.tokens == len(ids) - 1 and with_eot.tokens == len(ids)
    assert plain.loss == pytest.approx(total / (len(ids) - 1), rel=1e-9)
    assert with_eot.loss != pytest.approx(plain.loss, rel=1e-9)
    assert plain.bits_per_byte == pytest.approx(plain.loss / math.log(2), rel=1e-9)  # a byte an id
