"""One template renderer (``files/template.py``) for every chat template: each attack a template can make
(a loop without end, output or values too large, a power too large, recursion, every error Python or
Jinja raises inside it, a reach for Python's internals) is one ``TemplateError`` naming the template's
file, raised within the time bound; and every surface that renders a template (``generate.chat``, chat
data for ``train``, ``eval`` on chat data) goes through it, so each attack is one clean line there too.
Long conversations are cut to the window before they are tokenized whole."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import te_assembly.files.template as template_module
from te_assembly.errors import TemplateError
from te_assembly.files.template import MAX_CHARS, render_template
from tests.hostile.conftest import clean_failure, user_cli

SOURCE = "/models/evil/chat_template.jinja"
VARIABLES = {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True}

ATTACKS = {
    # (template, words of the message)
    "a loop without end": (
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
        "ran for more than",
    ),
    "a loop of output": (
        "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}",
        "",
    ),
    "a loop without end over a list": (
        "{% set x = range(100000)|list %}{% for a in x %}{% for b in x %}{% endfor %}{% endfor %}",
        "ran for more than",
    ),
    "% with a width given by '*'": ("{{ '%*d' % (1000000000, 1) }}", "takes the number"),
    "lipsum by the million": ("{{ lipsum(90000000) }}", "a call takes the number"),
    "lipsum at all": ("{{ lipsum(2) }}", "'lipsum' is undefined"),
    "a string multiplied": ("{{ 'x' * 10**9 }}", "'*' would make"),
    "a list multiplied": ("{{ (messages * 10**8)|length }}", "'*' would make"),
    "a string doubled in a namespace": (
        "{% set ns = namespace(x='ab') %}{% for i in range(64) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}",
        "namespace value",
    ),
    "a padding filter": ("{{ 'x'|center(1000000000) }}", "the filter center"),
    "a padding method": ("{{ 'x'.ljust(10**9) }}", "a call takes the number"),
    "str.format with a width": ("{{ '{:>9999999999}'.format(1) }}", "formats with a width"),
    "% with a width": ("{{ '%9999999999d' % 1 }}", "formats with a width"),
    "the format filter with a width": ("{{ '%9999999999d'|format(1) }}", "formats with a width"),
    "a power too large": ("{{ 7 ** 100000000 }}", "'**' would make"),
    "an integer too long to print": ("{{ 10 ** 5000 }}", "ValueError"),
    "a join too large": ("{{ (['x'] * 100000)|join('y' * 1000) }}", "join"),
    "recursion": ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "recursed without end"),
    "a range over the sandbox's limit": ("{{ range(10**6)|list }}", "OverflowError"),
    "a division by zero": ("{{ 1 / 0 }}", "ZeroDivisionError"),
    "a type error": ("{{ 1 + 'a' }}", "TypeError"),
    "a syntax error": ("{% for %}", "failed"),
    "an undefined name": ("{{ foo.bar }}", "undefined"),
    "a reach for Python's internals": ("{{ messages.__class__.__mro__ }}", "unsafe"),
    "a namespace key towards internals": ("{% set ns = namespace(_x=1) %}", "unsafe"),
    "raise_exception": ("{{ raise_exception('no system role') }}", "refused the conversation"),
}


@pytest.fixture
def short_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(template_module, "RENDER_SECONDS", 1.0)


@pytest.mark.parametrize("attack", ATTACKS, ids=list(ATTACKS))
def test_every_attack_is_one_clean_error_naming_the_template(attack: str, short_time: None) -> None:
    text, words = ATTACKS[attack]
    began = time.monotonic()
    with pytest.raises(TemplateError) as caught:
        render_template(text, SOURCE, VARIABLES)
    message = str(caught.value)
    assert message.startswith(f"{SOURCE}: ") and words in message, message
    assert time.monotonic() - began < 30  # the bound, not the attack, decided when it ended


def test_output_over_the_limit_is_refused_however_it_is_made(short_time: None) -> None:
    piece = "x" * (MAX_CHARS // 4)
    with pytest.raises(TemplateError, match="output is over"):
        render_template("{% for i in range(5) %}{{ piece }}{% endfor %}", SOURCE, {"piece": piece})


def test_ordinary_templates_are_untouched() -> None:
    """What real chat templates do (methods, filters, loops, format, loop variables) renders as Jinja
    renders it, numbers in the content included."""
    text = (
        "{% for m in messages %}{{ m.content.replace('a', 'b')|upper }}{{ '{} x'.format(m.content) }}"
        "{{ '%s!' % m.role }}{% for i in range(3) %}{{ loop.index }}/{{ loop.length }}{% endfor %}"
        "{{ m|tojson }}{% endfor %}{{ range(5)|list|join(',') }}"
    )
    messages = [{"role": "user", "content": "call 12345678901234"}]
    out = render_template(text, SOURCE, {"messages": messages})
    assert out == (
        "CBLL 12345678901234call 12345678901234 xuser!1/32/33/3"
        '{"role": "user", "content": "call 12345678901234"}0,1,2,3,4'
    )


HOSTILE = "{{ 'x' * 10**9 }}"


def _instruct(tmp_path: Path, template: str) -> Path:
    """An imported tiny Llama whose chat template is ``template``."""
    from tests.language.test_chat import _imported_instruct

    model = _imported_instruct(tmp_path)
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    return model


def test_generate_chat_renders_through_the_bounded_renderer(tmp_path: Path) -> None:
    model = _instruct(tmp_path, HOSTILE)
    done = user_cli(
        tmp_path, "generate", "hello", str(model), "generate.chat=true", "generate.max_new_tokens=2"
    )
    clean_failure(done, 1, "tokenizer_config.json", "'*' would make")


def _chat_data(tmp_path: Path, model: Path, conversation: list[dict[str, str]]) -> object:
    from te_assembly.data.settings import DataSettings, TokenizerSettings

    (tmp_path / "chat.jsonl").write_text(json.dumps({"messages": conversation}) + "\n")
    return DataSettings(
        path=str(tmp_path / "chat.jsonl"),
        format="chat",
        val_fraction=0.0,
        cache_dir=str(tmp_path / "cache"),
        tokenizer=TokenizerSettings(path=str(model / "tokenizer.json")),
    )


TURN = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hello there"}]


def test_chat_data_and_eval_render_through_the_bounded_renderer(tmp_path: Path) -> None:
    from te_assembly.data.conversations import ChatCorpus
    from te_assembly.errors import DataError
    from te_assembly.jobs.eval.job import evaluate
    from te_assembly.jobs.eval.settings import EvalSettings

    model = _instruct(tmp_path, HOSTILE)
    data = _chat_data(tmp_path, model, TURN)
    with pytest.raises(DataError, match=r"chat\.jsonl:1: .*tokenizer_config\.json: '\*' would make"):
        ChatCorpus.prepare(data, 32)  # type: ignore[arg-type]
    with pytest.raises(DataError, match="'\\*' would make"):
        evaluate(model, "reference", data, EvalSettings(seq_len=32, batch=1))  # type: ignore[arg-type]


def test_a_conversation_far_longer_than_the_window_is_cut_before_it_is_tokenized(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """5,000 turns and a 2-million-character answer: only a prefix of the text is tokenized and only the
    turns in the window are rendered one by one; the rows are those of the conversation cut by hand."""
    from te_assembly.data.chat import ChatTemplate
    from te_assembly.data.conversations import ChatCorpus
    from te_assembly.data.tokenizer import HFTokenizer

    model = _instruct(tmp_path, _chatml())
    long = [
        *TURN * 2,
        {"role": "user", "content": "what is it"},
        {"role": "assistant", "content": "a " * 10**6},
    ]
    long += TURN * 2500
    encoded: list[int] = []
    renders: list[int] = []
    original_encode, original_render = HFTokenizer.encode_offsets, ChatTemplate.render
    monkeypatch.setattr(
        HFTokenizer,
        "encode_offsets",
        lambda self, text: encoded.append(len(text)) or original_encode(self, text),
    )
    monkeypatch.setattr(
        ChatTemplate, "render", lambda self, *a, **k: renders.append(1) or original_render(self, *a, **k)
    )
    corpus = ChatCorpus.prepare(_chat_data(tmp_path, model, long), 32)  # type: ignore[arg-type]
    assert max(encoded) < 10_000 and len(renders) < 20
    (tmp_path / "short").mkdir()
    short = ChatCorpus.prepare(_chat_data(tmp_path / "short", model, long[:6]), 32)  # type: ignore[arg-type]
    assert [r.tolist() for r in corpus.rows(corpus.train)] == [r.tolist() for r in short.rows(short.train)]


def _chatml() -> str:
    from tests.language.test_chat import CHATML

    return CHATML


def test_the_render_puts_back_the_timer_and_handler_it_found(short_time: None) -> None:
    """The renderer's timer (main thread) leaves a caller's own alarm running, less the time spent."""
    import signal

    def mine(signum: int, frame: object) -> None:
        raise AssertionError("the caller's alarm went off during the test")

    before = signal.signal(signal.SIGALRM, mine)
    signal.setitimer(signal.ITIMER_REAL, 30.0)
    try:
        with pytest.raises(TemplateError, match="ran for more than"):
            render_template(ATTACKS["a loop without end over a list"][0], SOURCE, VARIABLES)
        assert signal.getsignal(signal.SIGALRM) is mine
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 20 < left < 30
        assert render_template("{{ 1 + 1 }}", SOURCE, VARIABLES) == "2"
        assert 20 < signal.getitimer(signal.ITIMER_REAL)[0] < 30
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
