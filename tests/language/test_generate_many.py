"""``generate.prompts_file``: a file of prompts (a line each, or JSON Lines of strings, ``{prompt}`` and
``{messages}``) decoded in left-padded batches into one JSON Lines record per prompt, each greedy
continuation the one the prompt gets alone; a bad line is named; the guide's command runs as written."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest
import torch

from te_assembly import load
from te_assembly.engines.target import Target
from te_assembly.errors import DataError
from te_assembly.jobs.generate.batch import GENERATIONS_FILE, generate_file
from te_assembly.jobs.generate.job import chat, generate
from te_assembly.jobs.generate.settings import GenerateSettings
from tests.conftest import user_cli
from tests.docs_text import block_after
from tests.language.test_chat import _imported_instruct

PROMPTS = ["def main(", "import os", "x", "class Foo(Bar):\n", "for i in range(10", ""]
"""Lengths from 0 to 18 bytes: the batches are padded on the left, the empty one starts a document."""


def _records(folder: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (folder / GENERATIONS_FILE).read_text().splitlines()]


@pytest.mark.parametrize("batch_size", [1, 4, 8])
def test_each_greedy_continuation_is_the_one_the_prompt_gets_alone(batch_size: int, tmp_path: Path) -> None:
    target = Target.of("reference", dtype=torch.float64, seed=1)
    model = target.build(load("dense_lm").checked_plan(), seed=1)
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    settings = GenerateSettings(
        prompts_file=str(tmp_path / "prompts.jsonl"), temperature=0, max_new_tokens=7, batch_size=batch_size
    )
    events: list[object] = []
    done = generate_file(model, target, settings, tmp_path, on_event=events.append)
    records = _records(tmp_path)
    assert [r["index"] for r in records] == list(range(len(PROMPTS)))
    assert [r["prompt"] for r in records] == PROMPTS
    alone = [
        generate(model, target, dataclasses.replace(settings, prompts_file=None, prompt=p)) for p in PROMPTS
    ]
    assert [r["text"] for r in records] == [a.text for a in alone]
    assert [r["tokens"] for r in records] == [len(a.ids) for a in alone]
    assert done.tokens == sum(len(a.ids) for a in alone) and done.prompts == len(PROMPTS)
    batches = -(-len(PROMPTS) // batch_size)
    assert [e.done for e in events] == [min((n + 1) * batch_size, len(PROMPTS)) for n in range(batches)]


def test_a_text_file_is_a_prompt_a_line_and_conversations_take_the_chat_template(tmp_path: Path) -> None:
    model = _imported_instruct(tmp_path)
    (tmp_path / "lines.txt").write_text("hello there\n\nwhat is it\n")
    messages = [{"role": "user", "content": "what is it"}]
    (tmp_path / "mixed.jsonl").write_text(
        json.dumps({"messages": messages}) + "\n" + json.dumps({"prompt": "hello there"}) + "\n"
    )
    base = GenerateSettings(temperature=0, max_new_tokens=4, stop_at_eot=False)
    lines = dataclasses.replace(base, prompts_file=str(tmp_path / "lines.txt"))
    generate_file(model, "reference", lines, tmp_path / "a")
    records = _records(tmp_path / "a")
    assert [r["prompt"] for r in records] == ["hello there", "what is it"]  # blank lines are no prompt
    assert [r["where"] for r in records] == [f"{tmp_path / 'lines.txt'}:1", f"{tmp_path / 'lines.txt'}:3"]
    mixed = dataclasses.replace(base, prompts_file=str(tmp_path / "mixed.jsonl"))
    generate_file(model, "reference", mixed, tmp_path / "b")
    first, second = _records(tmp_path / "b")
    assert first["prompt"] == messages
    assert first["text"] == chat(model, "reference", messages, base).text
    assert (
        second["text"] == generate(model, "reference", dataclasses.replace(base, prompt="hello there")).text
    )
    # with generate.chat, a plain line is the user's message too
    as_chat = dataclasses.replace(lines, chat=True)
    generate_file(model, "reference", as_chat, tmp_path / "c")
    assert _records(tmp_path / "c")[1]["text"] == first["text"]


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("42", "a string or a list of messages"),
        ('{"prompt": "a", "messages": []}', "prompt or messages (one of them)"),
        ('{"messages": [{"role": "robot", "content": "hi"}]}', "role 'robot'"),
        ("{not json", "prompts.jsonl:2"),
    ],
)
def test_a_bad_line_is_named(line: str, words: str, tmp_path: Path) -> None:
    (tmp_path / "prompts.jsonl").write_text('"fine"\n' + line + "\n")
    settings = GenerateSettings(prompts_file=str(tmp_path / "prompts.jsonl"))
    model = Target.of("reference").build(load("dense_lm").checked_plan())
    with pytest.raises(DataError, match=r"prompts\.jsonl:2") as caught:
        generate_file(model, "reference", settings, tmp_path)
    assert words in str(caught.value)
    assert not (tmp_path / GENERATIONS_FILE).exists()  # nothing decoded before every line is read


def test_the_command_line_writes_generations_in_the_run_directory(tmp_path: Path) -> None:
    (tmp_path / "prompts.txt").write_text("def main(\nimport os\n")
    ran = user_cli(tmp_path, *_guide_command()[3:])
    assert ran.returncode == 0, ran.stderr
    (written,) = tmp_path.glob(f"outputs/dense_lm/*/{GENERATIONS_FILE}")
    assert [r["prompt"] for r in _records(written.parent)] == ["def main(", "import os"]
    assert (written.parent / "config.yaml").is_file()
    assert f"wrote {written}: 2 prompts" in ran.stdout
    refused = user_cli(
        tmp_path,
        "generate",
        "hi",
        "model=dense_lm",
        "generate.prompts_file=prompts.txt",
        "generate.prompt_file=x",
    )
    assert refused.returncode != 0 and "without a prompt" in refused.stderr
    alone = user_cli(tmp_path, "generate", "hi", "model=dense_lm", "generate.max_new_tokens=2")
    assert alone.returncode == 0
    assert len(list(tmp_path.glob("outputs/dense_lm/*"))) == 1  # one prompt writes no run directory


def _guide_command() -> list[str]:
    (line,) = block_after("guides/language-models.md", "generate.prompts_file", "bash").strip().splitlines()
    words = shlex.split(line)
    assert words[:4] == ["python", "-m", "te_assembly", "generate"]
    return words
