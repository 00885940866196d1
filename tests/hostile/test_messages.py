"""Every message names the user's own file and key, and a command that cannot start leaves nothing
behind: ``verify hf=DIR`` files its run under the checkpoint's name and shows only its own output, a
train on too little text stops before it makes a run directory, an empty config file is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hostile.conftest import clean_failure, user_cli


def test_verify_hf_files_its_run_under_the_checkpoint_and_shows_only_its_own_output(
    hf_llama: Path, tmp_path: Path
) -> None:
    pytest.importorskip("transformers")
    done = user_cli(tmp_path, "verify", f"hf={hf_llama}", "dtype=float64", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [p.name for p in (tmp_path / "outputs").iterdir()] == [hf_llama.name]
    assert "Loading" not in done.stderr and "it/s]" not in done.stderr, done.stderr


def test_a_corpus_shorter_than_one_sequence_stops_before_any_run_directory(tmp_path: Path) -> None:
    (tmp_path / "tiny.txt").write_text("too short")
    done = user_cli(tmp_path, "train", "model=dense_lm", "data.path=tiny.txt", "train.seq_len=64")
    clean_failure(done, 1, "tiny.txt")
    assert not (tmp_path / "outputs").exists()
    assert "━" not in done.stdout  # no progress bar drawn for a run that never started


def test_an_empty_config_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "empty.yaml").write_text("")
    done = user_cli(tmp_path, "validate", "model=empty.yaml")
    clean_failure(done, 2, f"{tmp_path / 'empty.yaml'}: error: model: the model file is empty")
