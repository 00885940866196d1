"""Instruction fine-tuning (``data.format=chat``): the assistant's tokens are exactly those transformers'
``apply_chat_template(..., return_assistant_tokens_mask=True)`` marks for a template with
``{% generation %}`` blocks (its own tokenizer class, a byte-level BPE); for a template without them,
each answer and its end of turn; the loss is on those tokens only (no other position gets a gradient);
a fine-tune of an imported checkpoint learns the answers, and its Hugging Face export carries the
tokenizer and the chat template."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

import te_assembly
from te_assembly.data.chat import ChatTemplate
from te_assembly.data.conversations import IGNORE, ChatCorpus, assistant_spans, tokenized
from te_assembly.data.settings import DataSettings, TokenizerSettings
from te_assembly.data.tokenizer import train_bpe
from te_assembly.jobs import objective
from te_assembly.jobs.train.settings import TrainSettings

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
UNTAGGED = CHATML.replace("{% generation %}", "").replace("{% endgeneration %}", "")
CONVERSATION = [
    {"role": "system", "content": "Answer with one word."},
    {"role": "user", "content": "What colour is the sky?"},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "And grass?"},
    {"role": "assistant", "content": "Green, mostly."},
]
QUESTIONS = {"What colour is the sky?": "Blue.", "What colour is grass?": "Green.", "Two plus two?": "Four."}


def _bpe() -> object:
    texts = [json.dumps(CONVERSATION), *QUESTIONS, *QUESTIONS.values(), "<|im_start|><|im_end|>\n"] * 5
    return train_bpe(texts, 400, "<|endoftext|>")


def test_assistant_tokens_equal_transformers_mask() -> None:
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer

    tokenizer = _bpe()
    text, spans = assistant_spans(ChatTemplate(CHATML, "test"), CONVERSATION, "test")
    ids, mine = tokenized(tokenizer, text, spans, 10_000)  # type: ignore[arg-type]
    theirs_tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(tokenizer._json)  # type: ignore[attr-defined]
    )
    theirs_tokenizer.chat_template = CHATML
    out = theirs_tokenizer.apply_chat_template(
        CONVERSATION, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    assert ids.tolist() == list(out["input_ids"])
    assert mine.astype(int).tolist() == list(out["assistant_masks"])
    assert mine.any() and not mine.all()


def test_without_generation_blocks_each_answer_and_its_end_of_turn_is_the_assistants() -> None:
    tokenizer = _bpe()
    text, spans = assistant_spans(ChatTemplate(UNTAGGED, "test"), CONVERSATION, "test")
    assert [text[a:b] for a, b in spans] == ["Blue.<|im_end|>\n", "Green, mostly.<|im_end|>\n"]
    ids, mine = tokenized(tokenizer, text, spans, 10_000)  # type: ignore[arg-type]
    answered = tokenizer.decode([int(i) for i, m in zip(ids, mine, strict=True) if m])  # type: ignore[attr-defined]
    assert answered == "Blue.<|im_end|>\nGreen, mostly.<|im_end|>\n"


def _instruct(tmp_path: Path) -> tuple[Path, Path]:
    """An imported tiny Llama with the BPE and a ChatML template, and JSON Lines of conversations."""
    from tests.hf.tiny import make

    source = make("llama", tmp_path / "hf", changes={"vocab_size": 400})
    tokenizer = _bpe()
    tokenizer.save(source / "tokenizer.json")  # type: ignore[attr-defined]
    (source / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": UNTAGGED, "eos_token": "<|im_end|>"})
    )
    imported = te_assembly.import_hf(source, tmp_path / "imported")
    lines = []
    for question, answer in QUESTIONS.items():
        messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        lines += [json.dumps({"messages": messages})] * 4
    (tmp_path / "sft.jsonl").write_text("\n".join(lines) + "\n")
    return imported, tmp_path / "sft.jsonl"


def _data(imported: Path, jsonl: Path, tmp_path: Path) -> DataSettings:
    return DataSettings(
        path=str(jsonl),
        format="chat",
        val_fraction=0.0,
        cache_dir=str(tmp_path / "cache"),
        tokenizer=TokenizerSettings(path=str(imported / "tokenizer.json")),
    )


def test_a_fine_tune_learns_the_answers_and_nothing_else_gets_a_gradient(tmp_path: Path) -> None:
    imported, jsonl = _instruct(tmp_path)
    data = _data(imported, jsonl, tmp_path)
    corpus = ChatCorpus.prepare(data, 32)
    x, labels = corpus.batch(0, 1, 6)
    assert (labels != IGNORE).any()
    model = te_assembly.from_pretrained(imported, "reference").train()
    y, extras = model(x)
    y.retain_grad()
    loss = objective.total(objective.next_token_terms(y, labels, extras, model.loss_output_names))
    loss.backward()
    assert y.grad is not None
    quiet = (labels == IGNORE)[..., None].expand_as(y.grad)
    assert y.grad[quiet].abs().max() == 0  # the prompt and the padding: no gradient
    assert y.grad[~quiet].abs().max() > 0
    before = float(loss.detach())

    plan = te_assembly.load("imported", config_dirs=[imported]).checked_plan()
    settings = TrainSettings(
        steps=40,
        batch_tokens=8 * 32,
        seq_len=32,
        lr=3e-3,
        warmup_steps=0,
        out_dir=str(tmp_path / "run"),
        init_from=str(imported),
        plot=False,
        eval_every=0,
    )
    trained = te_assembly.train(plan, "reference", settings, data=data)
    assert trained.evaluations == []  # val_fraction=0: no held-out conversations
    tuned = te_assembly.from_checkpoint(tmp_path / "run", "reference").eval()
    with torch.no_grad():
        y, extras = tuned(x)
        after = float(objective.next_token_terms(y, labels, extras, ())[objective.CROSS_ENTROPY])
    assert after < 0.5 * before, (before, after)

    from te_assembly.formats.hf.convert import export_hf

    out = export_hf(tmp_path / "run", tmp_path / "exported")
    assert (out / "tokenizer.json").is_file()
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == UNTAGGED


def test_chat_data_without_a_tokenizer_or_answers_is_refused(tmp_path: Path) -> None:
    from te_assembly.errors import DataError

    imported, jsonl = _instruct(tmp_path)
    with pytest.raises(DataError, match=r"set data\.tokenizer\.path"):
        ChatCorpus.prepare(DataSettings(path=str(jsonl), format="chat"), 32)
    (tmp_path / "questions.jsonl").write_text(
        json.dumps({"messages": [{"role": "user", "content": "Hi"}]}) + "\n"
    )
    corpus = ChatCorpus.prepare(_data(imported, tmp_path / "questions.jsonl", tmp_path), 32)
    with pytest.raises(DataError, match="no assistant tokens"):
        corpus.check_fits(400, "imported")
    (tmp_path / "bad.jsonl").write_text(json.dumps({"text": "no messages"}) + "\n")
    with pytest.raises(DataError, match=r"bad\.jsonl:1 has no 'messages' list"):
        ChatCorpus.prepare(_data(imported, tmp_path / "bad.jsonl", tmp_path), 32)


def test_eval_on_conversations_scores_the_answers(tmp_path: Path) -> None:
    """``eval`` with ``data.format=chat``: the mean cross-entropy over the assistant's tokens of every
    conversation, what the fine-tune's objective computes on the same rows."""
    from te_assembly.jobs.eval.job import evaluate
    from te_assembly.jobs.eval.settings import EvalSettings

    imported, jsonl = _instruct(tmp_path)
    data = _data(imported, jsonl, tmp_path)
    result = evaluate(imported, "reference", data, EvalSettings(seq_len=32, batch=5))
    corpus = ChatCorpus.prepare(data, 32)
    model = te_assembly.from_pretrained(imported, "reference")
    x, labels = corpus.rows(corpus.train)
    with torch.no_grad():
        y, extras = model(x)
        expected = float(objective.next_token_terms(y, labels, extras, ())[objective.CROSS_ENTROPY])
    assert result.tokens == int((labels != IGNORE).sum()) and result.windows == len(corpus.train)
    assert result.loss == pytest.approx(expected, rel=1e-5)


def test_held_out_conversations_are_evaluated_on_their_answers(tmp_path: Path) -> None:
    imported, jsonl = _instruct(tmp_path)
    lines = jsonl.read_text().splitlines()
    # distinct names; held out by a hash of each one's file and line, so enough that 4 are always held out
    many = [json.dumps({**json.loads(line), "id": n}) for n, line in enumerate(lines * 10)]
    jsonl.write_text("\n".join(many) + "\n")
    data = dataclasses.replace(_data(imported, jsonl, tmp_path), val_fraction=0.2)
    corpus = ChatCorpus.prepare(data, 32)
    assert corpus.has_validation and corpus.train
    (x, labels), *_ = corpus.eval_batches(1, 4)
    assert x.shape == labels.shape == (4, 32) and (labels != IGNORE).any()
    plan = te_assembly.load("imported", config_dirs=[imported]).checked_plan()
    settings = TrainSettings(
        steps=4,
        batch_tokens=4 * 32,
        seq_len=32,
        out_dir=str(tmp_path / "run"),
        init_from=str(imported),
        plot=False,
        eval_every=2,
    )
    trained = te_assembly.train(plan, "reference", settings, data=data)
    assert [step for step, _ in trained.evaluations] == [2, 4]
    assert all(m["val_loss"] > 0 and m["val_bits_per_byte"] is None for _, m in trained.evaluations)


def test_lora_adapters_learn_the_answers_on_a_frozen_import(tmp_path: Path) -> None:
    """Instruction tuning with rank-8 adapters only: the answers are learnt, the imported weights are
    untouched, and the checkpoint holds the adapters alone. The head is adapted too: at this size, a
    frozen random head keeps the answers' ids out of the projections' reach (the loss stalls near 5.4)."""
    imported, jsonl = _instruct(tmp_path)
    data = _data(imported, jsonl, tmp_path)
    corpus = ChatCorpus.prepare(data, 32)
    x, labels = corpus.batch(0, 1, 6)
    base = te_assembly.from_pretrained(imported, "reference").eval()
    with torch.no_grad():
        y, extras = base(x)
        before = float(objective.next_token_terms(y, labels, extras, ())[objective.CROSS_ENTROPY])
    plan = te_assembly.load(
        "imported", ["lora.rank=8", "lora.targets=[all-linear,head]"], config_dirs=[imported]
    ).checked_plan()
    settings = TrainSettings(
        steps=80,
        batch_tokens=8 * 32,
        seq_len=32,
        lr=1e-2,
        warmup_steps=0,
        out_dir=str(tmp_path / "lora"),
        init_from=str(imported),
        plot=False,
        eval_every=0,
    )
    te_assembly.train(plan, "reference", settings, data=data)
    tuned = te_assembly.from_checkpoint(tmp_path / "lora", "reference").eval()
    with torch.no_grad():
        y, extras = tuned(x)
        after = float(objective.next_token_terms(y, labels, extras, ())[objective.CROSS_ENTROPY])
    assert after < 0.5 * before, (before, after)
    state = tuned.state_dict()
    for name, value in base.state_dict().items():
        assert torch.equal(state[name], value), name  # the base did not move
    from te_assembly.formats.checkpoint import list_checkpoints, model_state

    saved = model_state(list_checkpoints(tmp_path / "lora")[-1][1])[1]
    assert set(saved) == set(plan.adapter_params)


def _one_conversation(tmp_path: Path, template: str) -> tuple[DataSettings, object]:
    """A tokenizer folder with ``template`` and a JSON Lines file holding ``CONVERSATION``."""
    tokenizer = _bpe()
    (tmp_path / "tok").mkdir()
    tokenizer.save(tmp_path / "tok" / "tokenizer.json")  # type: ignore[attr-defined]
    config = {"chat_template": template, "eos_token": "<|im_end|>"}
    (tmp_path / "tok" / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "chat.jsonl").write_text(json.dumps({"messages": CONVERSATION}) + "\n")
    data = DataSettings(
        path=str(tmp_path / "chat.jsonl"),
        format="chat",
        val_fraction=0.0,
        cache_dir=str(tmp_path / "cache"),
        tokenizer=TokenizerSettings(path=str(tmp_path / "tok" / "tokenizer.json")),
    )
    return data, tokenizer


def _labels_expected(ids: list[int], answer: list[bool]) -> list[int]:
    """Position t is trained on token t+1 exactly when token t+1 is the assistant's."""
    return [ids[t + 1] if answer[t + 1] else IGNORE for t in range(len(ids) - 1)]


def test_the_rows_train_each_answer_from_its_first_token_to_its_end_of_turn(tmp_path: Path) -> None:
    """The labels the loss reads, against the character offsets of each assistant message in the text
    rendered by hand (no code under test builds the expectation): each answer's first token is a label,
    and the first token after its turn (the next ``<|im_start|>``) is not."""
    from tokenizers import Tokenizer

    data, tokenizer = _one_conversation(tmp_path, UNTAGGED)
    corpus = ChatCorpus.prepare(data, 256)
    x, labels = corpus.rows(corpus.train)
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in CONVERSATION)
    spans, at = [], 0
    for message in CONVERSATION:
        at = text.index(f"<|im_start|>{message['role']}\n{message['content']}", at)
        start = at + len(f"<|im_start|>{message['role']}\n")
        at = text.index("<|im_start|>", start) if "<|im_start|>" in text[start:] else len(text)
        if message["role"] == "assistant":
            spans.append((start, at))  # its content, <|im_end|> and the newline the template ends it with
    encoding = Tokenizer.from_str(tokenizer._json).encode(text)  # type: ignore[attr-defined]
    ids, offsets = encoding.ids, encoding.offsets
    answer = [any(a <= s < b for a, b in spans) for s, _ in offsets]
    n = len(ids) - 1
    assert n < 256 and x[0, :n].tolist() == ids[:-1]
    assert labels[0, :n].tolist() == _labels_expected(ids, answer)
    assert (labels[0, n:] == IGNORE).all()
    for start, end in spans:
        first = next(t for t, (s, _) in enumerate(offsets) if s == start)
        assert labels[0, first - 1] == ids[first]  # the answer's first token is trained
        after = next(t for t, (s, _) in enumerate(offsets) if s >= end) if end < len(text) else None
        if after is not None:
            assert labels[0, after - 1] == IGNORE  # the token after the turn is not


GENERATION_SPELLINGS = [
    ("{% generation %}", "{% endgeneration %}"),
    ("{%- generation %}", "{% endgeneration -%}"),
    ("{% generation -%}", "{%- endgeneration %}"),
    ("{%- generation -%}", "{%- endgeneration -%}"),
    ("{%generation%}", "{%endgeneration%}"),
    ("{%+ generation +%}", "{%+ endgeneration +%}"),
    ("{%-generation-%}", "{%+endgeneration%}"),
]


@pytest.mark.parametrize(("opening", "closing"), GENERATION_SPELLINGS)
def test_every_spelling_of_the_generation_tag_gives_transformers_mask(
    opening: str, closing: str, tmp_path: Path
) -> None:
    """The tags with white space and dashes around them (which change the rendered text), and the labels
    the loss reads equal transformers' ``assistant_masks`` shifted by one."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer

    template = (
        "{% for message in messages %}\n  {{ '<|im_start|>' + message['role'] + '\n' }}\n"
        "  {% if message['role'] == 'assistant' %}\n    " + opening + "\n    "
        "{{ message['content'] + '<|im_end|>' }}\n    " + closing + "\n  {% else %}\n"
        "    {{ message['content'] + '<|im_end|>' }}\n  {% endif %}\n  {{ '\n' }}\n{% endfor %}"
    )
    data, tokenizer = _one_conversation(tmp_path, template)
    theirs = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(tokenizer._json)  # type: ignore[attr-defined]
    )
    theirs.chat_template = template
    out = theirs.apply_chat_template(
        CONVERSATION, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = list(out["input_ids"]), [bool(m) for m in out["assistant_masks"]]
    assert any(mask) and not all(mask)
    corpus = ChatCorpus.prepare(data, 256)
    x, labels = corpus.rows(corpus.train)
    n = len(ids) - 1
    assert x[0, :n].tolist() == ids[:-1]
    assert labels[0, :n].tolist() == _labels_expected(ids, mask)


def test_a_generation_tag_in_a_comment_or_raw_block_marks_nothing() -> None:
    commented = UNTAGGED.replace("{% endfor %}", "{# {% generation %} #}{% endfor %}")
    raw = UNTAGGED + "{% raw %}{% generation %}{% endraw %}"
    assert not ChatTemplate(commented, "test").marks_generation
    assert not ChatTemplate(raw, "test").marks_generation
    assert ChatTemplate(CHATML, "test").marks_generation
