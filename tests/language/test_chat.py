"""Chat templates: rendered as transformers' ``apply_chat_template`` renders them (its own tokenizer class,
the same templates, the same conversations), in a sandbox that keeps a downloaded template away from
Python's internals; ``generate.chat`` and ``generate.interactive`` on an imported instruct-style model."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from te_assembly.data.chat import ChatTemplate, ChatTemplateError, load_chat_template

CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face'"
    " + '<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)
STRUCTURED = """{%- set ns = namespace(turns=0) -%}
{%- for message in messages -%}
  {%- if message.role == 'system' %}{% continue %}{% endif -%}
  {%- set ns.turns = ns.turns + 1 -%}
  <turn {{ ns.turns }} role={{ message.role | tojson }}>
  {%- if message.role == 'assistant' %}{% generation %}{{ message.content }}{% endgeneration %}
  {%- else %}{{ message.content | tojson }}{% endif %}</turn>
{% endfor -%}
{%- if add_generation_prompt %}<turn {{ ns.turns + 1 }} role="assistant">{% endif -%}
{{ dict(a=1) | tojson }}"""

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a colour, in français: « bleu »?"},
        {"role": "assistant", "content": "  Bleu.  "},
        {"role": "user", "content": "And <another> one & more"},
    ],
]
TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}


def _transformers_render(template: str, messages: list[dict[str, str]]) -> str:
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models

    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "<s>": 1, "</s>": 2}, unk_token="[UNK]"))
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, **TOKENS)
    tokenizer.chat_template = template
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


@pytest.mark.parametrize("template", [CHATML, LLAMA2, STRUCTURED], ids=["chatml", "llama2", "structured"])
@pytest.mark.parametrize("number", range(len(CONVERSATIONS)))
def test_rendering_equals_transformers(template: str, number: int) -> None:
    messages = CONVERSATIONS[number]
    mine = ChatTemplate(template, "test", dict(TOKENS)).render(messages)
    assert mine == _transformers_render(template, messages)


def test_a_template_that_raises_names_the_reason() -> None:
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        ChatTemplate(LLAMA2, "test", dict(TOKENS)).render(bad)


@pytest.mark.parametrize(
    "template",
    [
        "{% set x = messages.append({'role': 'user', 'content': 'x'}) %}",  # changing what it is given
        "{{ messages.__class__.__mro__[1].__subclasses__() }}",  # reaching Python's classes
        "{% set ns = namespace(_secret=1) %}",
        "{{ dict.__call__.__globals__ }}",
    ],
)
def test_the_sandbox_keeps_a_template_from_python(template: str) -> None:
    messages = [{"role": "user", "content": "hi"}]
    try:
        rendered = ChatTemplate(template, "test").render(messages)
    except ChatTemplateError as exc:
        assert "unsafe" in str(exc) or "failed" in str(exc)
    else:  # an unsafe attribute reads as undefined: nothing of Python's reaches the prompt
        assert "class" not in rendered and "builtins" not in rendered and rendered.strip() == ""
    assert messages == [{"role": "user", "content": "hi"}]


def test_a_conversation_is_checked_before_rendering() -> None:
    template = ChatTemplate(CHATML, "test")
    with pytest.raises(ChatTemplateError, match="role 'wizard'"):
        template.render([{"role": "wizard", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="content is not text"):
        template.render([{"role": "user", "content": 3}])


def test_the_template_is_found_where_checkpoints_keep_it(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {"chat_template": [{"name": "default", "template": CHATML}], "eos_token": {"content": "</s>"}}
        )
    )
    found = load_chat_template(tmp_path)
    assert found.text == CHATML and found.tokens["eos_token"] == "</s>"
    (tmp_path / "chat_template.jinja").write_text(LLAMA2)  # the separate file wins, as in transformers
    assert load_chat_template(tmp_path).text == LLAMA2
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        load_chat_template(tmp_path / "nothing-here")


def _imported_instruct(tmp_path: Path) -> Path:
    """A tiny random Llama made by transformers, with a word-level tokenizer whose end of turn is
    ``<|im_end|>`` and a ChatML template, imported."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from te_assembly.formats.hf.convert import import_hf
    from tests.hf.tiny import make

    source = make("llama", tmp_path / "hf")
    words = ["[UNK]", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "system", "user", "assistant"]
    words += ["hello", "there", "what", "is", "it", "You", "are", "a", "helpful", "AI", "named", "SmolLM,"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    (source / "tokenizer.json").write_text(backend.to_str())
    (source / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": CHATML, "eos_token": "<|im_end|>"})
    )
    return import_hf(source, tmp_path / "instruct")


def test_chat_is_generate_on_the_rendered_conversation(tmp_path: Path) -> None:
    from te_assembly.jobs.generate.job import chat, conversation, generate
    from te_assembly.jobs.generate.settings import GenerateSettings

    model = _imported_instruct(tmp_path)
    settings = GenerateSettings(temperature=0, max_new_tokens=6, stop_at_eot=False)
    answered = chat(model, "reference", conversation("hello there", "You are a helpful AI"), settings)
    rendered = "<|im_start|>system\nYou are a helpful AI<|im_end|>\n<|im_start|>user\nhello there<|im_end|>\n"
    prompt = rendered + "<|im_start|>assistant\n"
    plain = generate(model, "reference", dataclasses.replace(settings, prompt=prompt))
    assert answered.prompt_ids == plain.prompt_ids and answered.ids == plain.ids


def test_generate_chat_and_interactive_from_the_command_line(tmp_path: Path) -> None:
    model = _imported_instruct(tmp_path)
    env = {**os.environ, "COLUMNS": "200"}
    common = [sys.executable, "-m", "te_assembly", "generate"]
    done = subprocess.run(
        [
            *common,
            "hello",
            str(model),
            "generate.chat=true",
            "generate.temperature=0",
            "generate.max_new_tokens=4",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "chat template" in done.stdout and "tokens/s" in done.stdout
    talk = subprocess.run(
        [
            *common,
            str(model),  # a conversation's one word is its model
            "generate.chat=true",
            "generate.interactive=true",
            "generate.temperature=0",
            "generate.max_new_tokens=3",
        ],
        input="hello\nwhat is it\n\n",
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert talk.returncode == 0, talk.stderr
    assert talk.stdout.count("tokens/s") == 2  # two turns answered, then the empty line ended it
    refused = subprocess.run(
        [*common, "hello", "generate.source=" + str(model), "generate.interactive=true"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert refused.returncode != 0 and "generate.chat=true" in refused.stdout + refused.stderr
