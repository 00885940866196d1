"""``generate [PROMPT] [SOURCE]``: a language model continues a prompt, streamed to the terminal (the job:
``jobs/generate/``). SOURCE (``generate.source``) is a run directory, a checkpoint or a pretrained
directory; without one, the chosen ``model=`` with the seed's random weights (a smoke test of the model).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from te_assembly.analysis.analyze import COMMON_SECTIONS, Analysis, command_line_keys
from te_assembly.cli import job_dir
from te_assembly.cli.commands.session import start
from te_assembly.diagnostics import printable
from te_assembly.errors import ArgumentError
from te_assembly.jobs.generate.settings import GenerateSettings

if TYPE_CHECKING:
    from te_assembly.data.tokenizer import Tokenizer
    from te_assembly.engines.base import AssembledModel
    from te_assembly.engines.target import Target
    from te_assembly.jobs.generate.job import Generated

SECTIONS = {**COMMON_SECTIONS, "generate": GenerateSettings}
RUN_DIR = True  # generate.prompts_file writes generations.jsonl there; a single prompt leaves none


BAR = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())


def _tokenizer_words(tokenizer: object) -> str:
    source = getattr(tokenizer, "source", None)
    return f"tokenizer {source}" if source else "byte-level tokenizer"


def main(analysis: Analysis, console: Console) -> int:
    from te_assembly.jobs.generate.job import Text, load_source, read_prompt, tokenizer_for

    session = start(analysis, console)
    settings, taken = _settings(analysis, session.section("generate"))
    target = session.target
    source = Path(settings.source).expanduser() if settings.source is not None else None
    if settings.prompts_file is not None:
        job = job_dir.current("generate")
        job_dir.check_claimable(job)  # where it writes, before the model is loaded
    prompt = "" if settings.interactive or settings.prompts_file else read_prompt(settings)
    if settings.source is not None:
        model = load_source(settings.source, target)
        where = f"from {settings.source}"
    else:
        model = target.build(session.plan, seed=target.seed)
        where = (
            f"a fresh {session.plan.name} (random weights, seed {target.seed}: set generate.source to a run)"
        )
    tokenizer = tokenizer_for(source, settings)
    console.print(_heading(model.plan.name, where, tokenizer, settings, taken), markup=False, soft_wrap=True)
    if settings.prompts_file is not None:
        return _many(analysis, job, model, target, settings, tokenizer, source, console)
    console.rule(style="dim")
    out = console.file

    def stream(event: object) -> None:
        if isinstance(event, Text):
            out.write(event.text)
            out.flush()

    def answer(messages: list[dict[str, str]]) -> Generated:
        from te_assembly.jobs.generate.job import chat

        return chat(model, target, messages, settings, tokenizer=tokenizer, source=source, on_event=stream)

    if settings.interactive:
        return _converse(console, settings, answer)
    if settings.chat:
        from te_assembly.jobs.generate.job import conversation

        out.write(prompt + "\n")
        result = answer(conversation(prompt, settings.system))
    else:
        from te_assembly.jobs.generate.job import generate

        out.write(prompt)
        plain = dataclasses.replace(settings, prompt=prompt, prompt_file=None)
        result = generate(model, target, plain, tokenizer=tokenizer, source=source, on_event=stream)
    out.write("\n")
    console.rule(style="dim")
    console.print(_ending(result, settings), markup=False)
    if out is not sys.stdout:
        out.flush()
    return 0


def _many(
    analysis: Analysis,
    job: job_dir.JobDir,
    model: AssembledModel,
    target: Target,
    settings: GenerateSettings,
    tokenizer: Tokenizer,
    source: Path | None,
    console: Console,
) -> int:
    """``generate.prompts_file``: every prompt in batches, a progress bar, ``generations.jsonl``."""
    from te_assembly.jobs.events import Advanced
    from te_assembly.jobs.generate.batch import generate_file

    out = job_dir.claim(job)
    job_dir.write_config(out, analysis.resolved.as_config(), job)
    with Progress(*BAR, console=console, disable=not console.is_terminal) as progress:
        bar = progress.add_task("generate", total=None)

        def advanced(event: object) -> None:
            if isinstance(event, Advanced):
                progress.update(bar, completed=event.done, total=event.total)

        done = generate_file(
            model, target, settings, out, tokenizer=tokenizer, source=source, on_event=advanced
        )
    console.print(
        f"wrote {printable(str(done.path))}: {done.prompts} prompts, {done.tokens} tokens in "
        f"{done.seconds:.2f} s ({done.tokens / max(done.seconds, 1e-9):.1f} tokens/s, batches of "
        f"{settings.batch_size})",
        markup=False,
        soft_wrap=True,
    )
    return 0


def _heading(name: str, where: str, tokenizer: object, settings: GenerateSettings, taken: list[str]) -> str:
    """What generates, from where, with which tokenizer, how tokens are chosen."""
    how = (
        "greedy"
        if settings.temperature == 0
        else (f"temperature {settings.temperature:g}, top_k {settings.top_k}, top_p {settings.top_p}")
    )
    return (
        f"{printable(name)} {printable(where)}; {printable(_tokenizer_words(tokenizer))}; {how}; "
        f"up to {settings.max_new_tokens} tokens"
        + (f" ({', '.join(taken)} from generation_config.json)" if taken else "")
        + ("; chat template" if settings.chat else "")
    )


def _settings(analysis: Analysis, settings: GenerateSettings) -> tuple[GenerateSettings, list[str]]:
    """The settings, checked together, with the model's generation defaults where the command line
    gave none (and which those were) and the context decided (and refused past the model's) before the
    model loads."""
    from te_assembly.jobs.generate.job import generation_defaults, model_folder
    from te_assembly.jobs.window import window

    many = settings.prompts_file is not None
    if many and settings.source is None and settings.prompt is not None:
        # The prompts are the file's: the one word is the model (``generate SOURCE ...prompts_file``).
        settings = dataclasses.replace(settings, source=settings.prompt, prompt=None)
    if many and (settings.prompt is not None or settings.prompt_file is not None or settings.interactive):
        raise ArgumentError(
            "generate.prompts_file decodes the prompts of a file: give it without a prompt, "
            "generate.prompt_file or generate.interactive"
        )
    if settings.interactive and not settings.chat:
        raise ArgumentError("generate.interactive=true is a conversation: set generate.chat=true too")
    if settings.interactive and settings.source is None and settings.prompt is not None:
        # A conversation takes no prompt: its one word is the model (``generate SOURCE ...interactive``).
        settings = dataclasses.replace(settings, source=settings.prompt, prompt=None)
    if settings.chat and settings.source is None and settings.tokenizer is None:
        raise ArgumentError(
            "generate.chat needs a model with a chat template: set generate.source (or SOURCE)"
        )
    source = Path(settings.source).expanduser() if settings.source is not None else None
    given = [k.removeprefix("generate.") for k in command_line_keys(analysis.resolved.overrides)]
    settings, taken = generation_defaults(source, settings, given)
    if source is not None:
        name = model_folder(source).name
        settings = dataclasses.replace(
            settings, context=window(settings.context, source, "generate.context", name)
        )
    return settings, taken


def _ending(result: Generated, settings: GenerateSettings) -> str:
    if result.stop_string is not None:
        ending = f"the stop string {result.stop_string!r}"
    elif result.stopped_at_eot:
        ending = "the end-of-text token"
    else:
        ending = f"generate.max_new_tokens={settings.max_new_tokens}"
    return (
        f"{len(result.ids)} tokens in {result.seconds:.2f} s ({result.tokens_per_s:.1f} tokens/s, prompt "
        f"included in the time), stopped at {printable(ending)}"
    )


def _converse(
    console: Console, settings: GenerateSettings, answer: Callable[[list[dict[str, str]]], Generated]
) -> int:
    """Read a message, answer it, keep both; an empty line or the end of input ends the conversation."""
    messages = [{"role": "system", "content": settings.system}] if settings.system is not None else []
    console.print("an empty line ends the conversation", style="dim", markup=False)
    while True:
        try:
            line = console.input("> ")
        except EOFError:
            break
        if not line.strip():
            break
        messages.append({"role": "user", "content": line})
        result = answer(messages)
        console.file.write("\n")
        console.print(_ending(result, settings), style="dim", markup=False)
        messages.append({"role": "assistant", "content": result.text})
    return 0
