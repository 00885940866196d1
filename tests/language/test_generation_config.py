"""A checkpoint's generation files honoured as transformers reads them: ``generation_config.json``'s
sampling choices (for every setting the user did not give) and ``eos_token_id``; a tokenizer whose text
ends with another token than ``<|endoftext|>`` (Llama 3's ``<|end_of_text|>``) loaded with its
``tokenizer_config.json``'s ``eos_token``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from te_assembly.data.chat import model_tokenizer
from te_assembly.errors import DataError
from te_assembly.jobs.generate.job import generation_defaults, stop_ids_of
from te_assembly.jobs.generate.settings import GenerateSettings


def _folder(tmp_path: Path, config: dict[str, object]) -> Path:
    (tmp_path / "generation_config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(
    ("config", "given", "expected"),
    [
        ({"eos_token_id": 2}, [], {"temperature": 0.0}),  # no do_sample: transformers is greedy
        ({"do_sample": False, "temperature": 0.6}, [], {"temperature": 0.0}),
        (
            {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 20, "max_new_tokens": 64},
            [],
            {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "max_new_tokens": 64},
        ),
        ({"do_sample": True, "temperature": 0.6, "top_p": 0.9}, ["temperature"], {"top_p": 0.9}),
        ({"do_sample": True, "temperature": -1, "top_p": 7, "top_k": 0}, [], {}),  # refused values: ignored
        ({"do_sample": False}, ["temperature"], {}),
    ],
)
def test_generation_config_chooses_what_the_user_did_not(
    tmp_path: Path, config: dict[str, object], given: list[str], expected: dict[str, object]
) -> None:
    base = GenerateSettings()
    settings, taken = generation_defaults(_folder(tmp_path, config), base, given)
    assert taken == sorted(expected)
    for name in ("temperature", "top_k", "top_p", "max_new_tokens"):
        assert getattr(settings, name) == expected.get(name, getattr(base, name))


def test_without_a_generation_config_nothing_changes(tmp_path: Path) -> None:
    assert generation_defaults(tmp_path, GenerateSettings(), []) == (GenerateSettings(), [])
    assert generation_defaults(None, GenerateSettings(), []) == (GenerateSettings(), [])


def _llama3_tokenizer(folder: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "hello", "world"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    (folder / "tokenizer.json").write_text(backend.to_str())
    return folder / "tokenizer.json"


def test_a_tokenizer_without_endoftext_takes_its_eos_token(tmp_path: Path) -> None:
    path = _llama3_tokenizer(tmp_path)
    with pytest.raises(DataError, match="has no '<\\|endoftext\\|>' token"):
        model_tokenizer(path, "<|endoftext|>")  # nothing says what ends a text: refused, as before
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|end_of_text|>"}))
    tokenizer = model_tokenizer(path, "<|endoftext|>")
    assert tokenizer.eot_id == 2 and tokenizer.eot == "<|end_of_text|>"
    _folder(tmp_path, {"eos_token_id": [2, 3]})
    assert stop_ids_of(tmp_path, tokenizer, GenerateSettings()) == frozenset({2, 3})
    assert stop_ids_of(tmp_path, tokenizer, GenerateSettings(stop_at_eot=False)) == frozenset()
