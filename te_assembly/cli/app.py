"""The command line as a Hydra application, driven per command.

``python -m te_assembly [COMMAND] [HYDRA FLAGS] [OVERRIDES]``: after the command word, the arguments are
exactly a Hydra app's (``hydra._internal.utils.get_args_parser``): ``--config-dir/-cd``, ``--cfg``,
``--info``, ``--multirun/-m``, ``--shell-completion/-sc``, ``--hydra-help``, ``--config-name/-cn``,
``--config-path/-cp``, ``hydra.verbose=...``. This module does what Hydra's ``_run_hydra`` does (build
the search path, create the ``Hydra`` object, dispatch on the flags) with three differences: the config
loader is te_assembly's (``config/composition.py``), ``--cfg`` and ``--help`` show the model and the
recipe as te_assembly reads them, and errors become exit codes instead of Hydra's report-and-exit(1):

- 0: ok; 1: runtime failure, or a fault no check foresaw (one line; ``TE_ASSEMBLY_TRACEBACK=1`` shows
  its traceback); 2: config or composition error, always one clean message, never a traceback. With
  ``-m``, the worst job's code, after a table of every job's outcome.

Each job (one with ``run``, several with ``-m``) is Hydra's ``run_job`` calling ``_job``, which reads
this job's overrides from ``HydraConfig``, runs the pipeline (``resolve_composed`` ->
``analyze_resolved``) and hands the analysis to the command.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from te_assembly.cli.commands import Outcome
from te_assembly.cli.hydra_flags import completion_config_dirs, shell_completion, show_cfg
from te_assembly.collector import paused
from te_assembly.diagnostics import printable
from te_assembly.errors import CompositionError, ConfigError, TeAssemblyError
from te_assembly.formats.hf.families import FAMILIES

_COMMAND_DOCS: dict[str, str] = {
    "run": "build the model and run a few forward+backward steps (default)",
    "validate": "check the config; exit 2 with every error",
    "explain": "print the resolved plan, channels and call signature",
    "graph": "draw the channel graph (Mermaid, DOT, SVG/PNG)",
    "verify": "compare the TE engine against the reference engine",
    "train": "a language model on text, any other model on a synthetic teacher task",
    "bench": "time forward, backward and step",
    "generate": "continue a prompt with a language model, streamed",
    "eval": "score a language model on a text: loss, perplexity, bits per byte",
    "export": "turn a training checkpoint into a pretrained model directory (format=hf: a Hugging Face one)",
    "import-hf": "turn a Hugging Face checkpoint into a pretrained model; its model_type one of "
    + ", ".join(f.model_type for f in FAMILIES.values()),
    "launch": "check a parallel job for N nodes x G GPUs, then write its Slurm, SkyPilot or torchrun script",
    "ls": "list the models, blocks, recipes and ops; `ls op NAME` shows one",
    "cp": "copy a shipped model, recipe or block into a folder to edit",
}
COMMANDS: dict[str, tuple[str, str]] = {
    name: (f"te_assembly.cli.commands.{name.replace('-', '_')}", doc) for name, doc in _COMMAND_DOCS.items()
}
"""Each command: its module (``cli/commands/<name>.py``) and its line in the usage."""
POSITIONAL: dict[str, tuple[str, ...]] = {
    "ls": ("what", "name"),
    "cp": ("source", "dest"),
    "export": ("checkpoint", "to"),
    "import-hf": ("source", "to"),
    "generate": ("prompt", "source"),
    "eval": ("source",),
}
"""Commands that take words after them: ``ls op GroupedLinear`` is ``ls ls.what=op ls.name=GroupedLinear``,
``export RUN_DIR OUT`` is ``export export.checkpoint=RUN_DIR export.to=OUT``."""
SECTION_OF = {"import-hf": "import_hf"}
"""A command whose settings section is spelt otherwise (a key cannot hold a hyphen in an override)."""
DEFAULT_COMMAND = "run"
PROG = "python -m te_assembly"

# Hydra flags that take a value, and --info's optional one.
_VALUE_FLAGS = {"--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn", "--cfg", "-c"}
_VALUE_FLAGS |= {"--package", "-p", "--experimental-rerun"}
_INFO_FLAGS = {"--info", "-i"}
_INFO_CHOICES = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}


@dataclass
class Split:
    """The command line taken apart: the command word and the rest, Hydra's arguments."""

    command: str | None
    hydra_args: list[str]
    unknown: str | None = None
    """A word in the command's place that is no command."""
    wants_help: bool = False
    words: list[str] = field(default_factory=list)
    """Bare words after a command that takes them (``POSITIONAL``)."""

    def overrides(self) -> list[str] | str:
        """The words as the overrides they stand for, or why they cannot be."""
        names = POSITIONAL.get(self.command or "", ())
        if len(self.words) > len(names):
            usage = " ".join(n.upper() for n in names)
            return (
                f"{self.command} takes at most {len(names)} argument(s) ({usage or 'none'}), got {self.words}"
            )
        from te_assembly.analysis.pipeline import quoted_value

        return [
            f"{SECTION_OF.get(self.command or '', self.command)}.{name}={quoted_value(word)}"
            for name, word in zip(names, self.words, strict=False)
        ]


def split_command(args: Sequence[str]) -> Split:
    """Find the command word: the first argument that is neither a flag, a flag's value, nor an
    override (``key=value``); flags may come before it (``-cd DIR validate``)."""
    rest: list[str] = []
    words: list[str] = []
    command = unknown = None
    wants_help = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-h", "--help"):
            wants_help = True
        elif arg in _VALUE_FLAGS and i + 1 < len(args):
            rest.extend(args[i : i + 2])
            i += 2
            continue
        elif arg in _INFO_FLAGS and i + 1 < len(args) and args[i + 1] in _INFO_CHOICES:
            rest.extend(args[i : i + 2])
            i += 2
            continue
        elif command is None and unknown is None and not arg.startswith("-") and "=" not in arg:
            if arg in COMMANDS or arg == "help":
                command = arg
            else:
                unknown = arg
            i += 1
            continue
        elif command in POSITIONAL and not arg.startswith("-") and "=" not in arg:
            words.append(arg)
            i += 1
            continue
        rest.append(arg)
        i += 1
    if command == "help":
        command, wants_help = None, True
    return Split(command, rest, unknown, wants_help, words)


@dataclass
class Consoles:
    out: Console
    err: Console


def consoles() -> Consoles:
    # Piped output (CI logs, tests) gets a wide fixed width so tables are not folded at 80 columns.
    out = Console(highlight=False, width=None if sys.stdout.isatty() else 140)
    err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 140)
    # Under torchrun only rank 0 prints tables and progress; every rank's errors say which rank it is.
    from te_assembly.cli.consoles import rank_consoles

    return Consoles(*rank_consoles(out, err))


# ------------------------------------------------------------------------------------------- errors


def composition_message(exc: BaseException, overrides: Sequence[str]) -> str:
    from te_assembly.config.composition_errors import describe

    return describe(exc, overrides)


def _report(exc: BaseException, io: Consoles, overrides: Sequence[str]) -> int:
    """The exit code for an error a command or Hydra raised on purpose, after printing it cleanly."""
    from te_assembly.cli.report import print_diagnostics
    from te_assembly.config.composition_errors import from_composition, syntax_error_in

    if isinstance(exc, ConfigError):
        from te_assembly.analysis.parallel.launch import current_launch

        if current_launch().is_main:  # every rank reads the same config: one copy of its findings
            print_diagnostics(exc.diagnostics, io.err)
        else:
            io.err.print(f"error: {len(exc.diagnostics)} config finding(s), listed by rank 0", markup=False)
        return 2
    if isinstance(exc, CompositionError):
        io.err.print(f"error: {printable(str(exc), keep_newlines=True)}", markup=False)
        return 2
    if from_composition(exc):
        syntax = syntax_error_in(exc)
        if syntax is not None:
            print_diagnostics([syntax], io.err)
            return 2
        message = composition_message(exc, overrides)
        io.err.print(f"error: {printable(message, keep_newlines=True)}", markup=False)
        return 2
    if isinstance(exc, TeAssemblyError):
        io.err.print(f"error: {printable(str(exc), keep_newlines=True)}", markup=False)
        return 1
    return last_resort(exc, io)


def last_resort(exc: BaseException, io: Consoles) -> int:
    """A fault no check foresaw: one line and exit 1, never a traceback (``TE_ASSEMBLY_TRACEBACK=1``
    re-raises it). In a sweep, the other jobs still run. A closed pipe goes on to ``main``, which stops
    quietly."""
    if isinstance(exc, BrokenPipeError) or os.environ.get("TE_ASSEMBLY_TRACEBACK") == "1":
        raise exc
    io.err.print(f"error: {printable(fault_message(exc))}", markup=False)
    return 1


def fault_message(exc: BaseException) -> str:
    """One line for an exception te_assembly did not raise on purpose (out of memory, an OS error...)."""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    if isinstance(exc, MemoryError) or "out of memory" in first.lower() or "can't allocate" in first:
        return f"out of memory: {first or type(exc).__name__}"
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror or first or type(exc).__name__}{where}"
    return (
        f"unexpected {type(exc).__name__}: {first} (set TE_ASSEMBLY_TRACEBACK=1 to see where; please "
        "report it)"
    )


# ------------------------------------------------------------------------------------------- jobs


@dataclass
class AppState:
    """What the task function needs that Hydra does not pass it."""

    command: str
    io: Consoles
    config_dirs: tuple[str, ...] = ()
    multirun: bool = False
    outcomes: list[tuple[list[str], Outcome]] = field(default_factory=list)
    made_run_dirs: tuple[Any, ...] = ()
    """A ``hydra.run.dir`` named by hand that did not exist before the job, with each missing parent
    (innermost first): Hydra creates them; removed again if the job leaves them empty."""


def _command_module(command: str) -> Any:
    return importlib.import_module(COMMANDS[command][0])


def _job(state: AppState, cfg: Any) -> Outcome:
    """One job: this job's overrides from Hydra, the pipeline, the command."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from te_assembly.analysis.analyze import analyze_resolved
    from te_assembly.config.resolved import resolve_composed

    hydra_cfg = HydraConfig.get()
    task = OmegaConf.to_container(hydra_cfg.overrides.task, resolve=False)  # resolving would evaluate values
    overrides = [str(o) for o in task]  # type: ignore[union-attr]
    if state.multirun:
        shown = " ".join(overrides) or "(no overrides)"
        state.io.out.print(f"[job {hydra_cfg.job.num}] {printable(shown)}", style="bold", markup=False)
    module = _command_module(state.command)
    try:
        with paused():  # see collector.py
            resolved = resolve_composed(cfg, overrides, state.config_dirs, hydra=hydra_cfg)
            analysis = analyze_resolved(resolved, module.SECTIONS)
        _check_launch(analysis, state.command)
        result = module.main(analysis, state.io.out)
        outcome = result if isinstance(result, Outcome) else Outcome(int(result))
    except KeyboardInterrupt as exc:
        from te_assembly.errors import Terminated

        terminated = isinstance(exc, Terminated)
        state.io.err.print("terminated" if terminated else "interrupted", markup=False)
        outcome = Outcome(143 if terminated else 130)
    except Exception as exc:  # te_assembly's, Hydra's and OmegaConf's errors; any other is one line too
        outcome = Outcome(_report(exc, state.io, overrides))
    finally:
        if writes_run_dir(state.command):  # a job that wrote nothing leaves no empty folder behind
            from te_assembly.cli.job_dir import current, remove_if_unused

            with contextlib.suppress(Exception):
                remove_if_unused(current(state.command))
            for folder in state.made_run_dirs:
                try:
                    folder.rmdir()  # only an empty directory goes
                except OSError:
                    break
    state.outcomes.append((overrides, outcome))
    return outcome


def writes_run_dir(command: str) -> bool:
    """Does ``command`` write into this job's run directory (``cli/job_dir.py``)?"""
    return bool(getattr(_command_module(command), "RUN_DIR", False))


def _sets(overrides: Sequence[str], key: str) -> bool:
    return any(o.lstrip("+~").split("=", 1)[0] == key for o in overrides)


def _run_dir_overrides(state: AppState, overrides: list[str], scratch: str | None) -> list[str]:
    """Hydra makes every job's output folder. Commands that write nothing get ``.`` (nothing made);
    under torchrun, ranks other than 0 get a scratch folder: rank 0 alone makes and writes the run
    directory (``train`` hands its path to the other ranks)."""
    extra: list[str] = []
    if not writes_run_dir(state.command):
        extra += [] if _sets(overrides, "hydra.run.dir") else ["hydra.run.dir=."]
        extra += [] if _sets(overrides, "hydra.sweep.subdir") else ["hydra.sweep.subdir=."]
    elif scratch is not None:
        extra.append(f"hydra.run.dir={scratch}")
    if scratch is not None and state.multirun:
        extra.append(f"hydra.sweep.dir={scratch}")
    return [*overrides, *extra]


def _check_launch(analysis: Any, command: str) -> None:
    """Under torchrun, every command needs the world the ``parallel`` sizes ask for (each rank runs this
    app on the same config). ``run``, ``train`` and ``bench`` also refuse sizes above 1 without torchrun,
    when they start the process groups (``engines/parallel/runtime.py``)."""
    from te_assembly.analysis.parallel.launch import current_launch

    launch = current_launch()
    settings = analysis.sections.get("parallel")
    if not launch.under_torchrun or settings is None:
        return
    from te_assembly.analysis.parallel.checks import launch_diagnostics

    found = launch_diagnostics(settings, launch, command)
    if found:
        raise ConfigError([*analysis.diagnostics, *found])


# ------------------------------------------------------------------------------------------- flags


def _parser() -> argparse.ArgumentParser:
    import hydra
    from hydra._internal.utils import get_args_parser

    from te_assembly.version import __version__

    parser = get_args_parser()
    parser.prog = f"{PROG} [COMMAND]"
    parser.exit_on_error = False
    for action in parser._actions:  # Hydra's --version says Hydra's: say ours, Hydra's beside it
        if "--version" in action.option_strings:
            action.version = f"te_assembly {__version__} (Hydra {hydra.__version__})"  # type: ignore[attr-defined]
    return parser


def _parse(hydra_args: list[str], io: Consoles) -> argparse.Namespace | int:
    parser = _parser()
    try:
        return parser.parse_args(hydra_args)
    except argparse.ArgumentError as exc:
        io.err.print(f"error: {exc}", markup=False)
        io.err.print(
            f"usage: {PROG} [COMMAND] [HYDRA FLAGS] [KEY=VALUE ...]   (--help for more)", markup=False
        )
        return 2
    except SystemExit as exc:  # --version, or an error argparse still exits for (it printed why)
        return exc.code if isinstance(exc.code, int) else 2


def run_command(command: str, hydra_args: list[str], io: Consoles) -> int:
    """Run ``command`` as a Hydra app with ``hydra_args`` (flags and overrides)."""
    parsed = _parse(hydra_args, io)
    if isinstance(parsed, int):
        return parsed
    args = parsed
    overrides = list(args.overrides)
    config_dirs: tuple[str, ...] = (str(args.config_dir),) if args.config_dir else ()
    if args.shell_completion and os.environ.get("COMP_LINE"):
        config_dirs = completion_config_dirs(os.environ["COMP_LINE"]) or config_dirs
    modes = (
        args.run + args.multirun + (args.cfg is not None) + args.shell_completion + (args.info is not None)
    )
    if modes > 1:
        io.err.print(
            "error: only one of --run, --multirun, --cfg, --info and --shell-completion", markup=False
        )
        return 2
    if args.resolve and args.cfg is None:
        io.err.print("error: --resolve only goes with --cfg", markup=False)
        return 2
    from hydra.core.global_hydra import GlobalHydra

    try:
        from te_assembly.config.composition import CONFIG_NAME, create_hydra

        hydra = create_hydra(command, config_dirs, args.config_path, writes_files=writes_run_dir(command))
        config_name = args.config_name or CONFIG_NAME
        if args.hydra_help:
            hydra.hydra_help(config_name=config_name, args_parser=_parser(), args=args)
            return 0
        if args.cfg is not None:
            return show_cfg(hydra, config_name, overrides, args, config_dirs, io)
        if args.info is not None:
            hydra.show_info(args.info, config_name=config_name, overrides=overrides)
            return 0
        if args.shell_completion:
            return shell_completion(hydra, config_name, overrides, tuple(COMMANDS))
        state = AppState(command, io, config_dirs, multirun=bool(args.multirun))
        return _run(hydra, state, config_name, overrides)
    except Exception as exc:
        return _report(exc, io, overrides)
    finally:
        GlobalHydra.instance().clear()


def _run(hydra: Any, state: AppState, config_name: str, overrides: list[str]) -> int:
    def task(cfg: Any) -> Outcome:
        return _job(state, cfg)

    from te_assembly.analysis.parallel.launch import current_launch

    with contextlib.ExitStack() as stack:
        scratch = None
        if not current_launch().is_main:
            # Under torchrun every rank runs the app; rank 0 alone records a sweep (multirun.yaml) and
            # makes the run directory.
            scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="te_assembly_rank_"))
        overrides = _run_dir_overrides(state, overrides, scratch)
        if state.multirun and scratch is None and not _sets(overrides, "hydra.sweep.dir"):
            overrides = [*overrides, _own_sweep_dir(hydra, config_name, overrides)]
        if not state.multirun:
            if scratch is None and writes_run_dir(state.command) and _sets(overrides, "hydra.run.dir"):
                state.made_run_dirs = _missing_dirs(hydra, config_name, overrides)
            hydra.run(config_name=config_name, task_function=task, overrides=overrides)
            return state.outcomes[-1][1].code if state.outcomes else 2
        return _multirun(hydra, state, config_name, overrides, task)


def _missing_dirs(hydra: Any, config_name: str, overrides: list[str]) -> tuple[Any, ...]:
    """The run directory the config names and its parents that do not exist yet, innermost first."""
    from pathlib import Path

    from hydra.types import RunMode

    try:
        cfg = hydra.compose_config(config_name, overrides, run_mode=RunMode.RUN, with_log_configuration=False)
        folder = Path(str(cfg.hydra.run.dir)).absolute()
    except Exception:  # the job reports what does not compose
        return ()
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return tuple(missing)


def _own_sweep_dir(hydra: Any, config_name: str, overrides: list[str]) -> str:
    """``hydra.sweep.dir=<dir>``: the sweep directory the config names (by default
    ``multirun/<date>/<time>``), claimed for this sweep alone (``job_dir.claim_sweep``), so two sweeps
    started in the same second each keep their own ``multirun.yaml``."""
    from pathlib import Path

    from hydra.types import RunMode

    from te_assembly.analysis.pipeline import quoted_value
    from te_assembly.cli import job_dir

    mode = RunMode.MULTIRUN
    cfg = hydra.compose_config(config_name, overrides, run_mode=mode, with_log_configuration=False)
    claimed = job_dir.claim_sweep(Path(str(cfg.hydra.sweep.dir)))
    return f"hydra.sweep.dir={quoted_value(str(claimed))}"


def _multirun(hydra: Any, state: AppState, config_name: str, overrides: list[str], task: Any) -> int:
    from te_assembly.cli.report import sweep_table

    try:
        hydra.multirun(config_name=config_name, task_function=task, overrides=overrides)
    finally:  # also when a later job's config does not compose: the jobs that ran are still reported
        if state.outcomes:
            state.io.out.print(sweep_table(state.command, state.outcomes))
    return max((o.code for _, o in state.outcomes), default=0)


__all__ = [
    "COMMANDS",
    "DEFAULT_COMMAND",
    "PROG",
    "Consoles",
    "consoles",
    "fault_message",
    "last_resort",
    "run_command",
    "split_command",
]
