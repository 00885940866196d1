"""``generate [PROMPT] [SOURCE]``: a language model continues a prompt, streamed to the terminal (the job:
``jobs/generate/``). SOURCE (``generate.source``) is a run directory, a checkpoint or a pretrained
directory; without one, the chosen ``model=`` with the seed's random weights (a smoke test of the model).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from rich.console import Console

from te_assembly.analysis.analyze import COMMON_SECTIONS, Analysis
from te_assembly.cli.commands.session import start
from te_assembly.diagnostics import printable
from te_assembly.jobs.generate.settings import GenerateSettings

SECTIONS = {**COMMON_SECTIONS, "generate": GenerateSettings}


def _tokenizer_words(tokenizer: object) -> str:
    source = getattr(tokenizer, "source", None)
    return f"tokenizer {source}" if source else "byte-level tokenizer"


def main(analysis: Analysis, console: Console) -> int:
    from te_assembly.jobs.generate.job import Text, generate, load_source, read_prompt, tokenizer_for

    session = start(analysis, console)
    settings: GenerateSettings = session.section("generate")
    target = session.target
    prompt = read_prompt(settings)
    source = Path(settings.source).expanduser() if settings.source is not None else None
    if settings.source is not None:
        model = load_source(settings.source, target)
        where = f"from {settings.source}"
    else:
        model = target.build(session.plan, seed=target.seed)
        where = (
            f"a fresh {session.plan.name} (random weights, seed {target.seed}: set generate.source to a run)"
        )
    tokenizer = tokenizer_for(source, settings)
    how = (
        "greedy"
        if settings.temperature == 0
        else (f"temperature {settings.temperature:g}, top_k {settings.top_k}, top_p {settings.top_p}")
    )
    console.print(
        f"{printable(model.plan.name)} {printable(where)}; {printable(_tokenizer_words(tokenizer))}; {how}; "
        f"up to {settings.max_new_tokens} tokens",
        markup=False,
        soft_wrap=True,
    )
    console.rule(style="dim")
    out = console.file
    out.write(prompt)

    def stream(event: object) -> None:
        if isinstance(event, Text):
            out.write(event.text)
            out.flush()

    result = generate(
        model,
        target,
        dataclasses.replace(settings, prompt=prompt, prompt_file=None),
        tokenizer=tokenizer,
        on_event=stream,
    )
    out.write("\n")
    console.rule(style="dim")
    ending = (
        "the end-of-text token"
        if result.stopped_at_eot
        else f"generate.max_new_tokens={settings.max_new_tokens}"
    )
    console.print(f"{len(result.ids)} tokens, stopped at {ending}", markup=False)
    if out is not sys.stdout:
        out.flush()
    return 0
