"""Entry point: pick the command, then run it as a Hydra application (``app.py``).

Exit codes: 0 ok, 1 runtime failure (verify mismatch, non-finite loss, engine unavailable),
2 config or composition error. No Python traceback: a fault nothing foresaw is one line and exit 1
(``TE_ASSEMBLY_TRACEBACK=1`` shows its traceback).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from te_assembly.cli.app import (
    COMMANDS,
    DEFAULT_COMMAND,
    Consoles,
    consoles,
    last_resort,
    run_command,
    split_command,
)

USAGE = """usage: python -m te_assembly [COMMAND] [HYDRA FLAGS] [KEY=VALUE ...]
       python -m te_assembly ls [WHAT [NAME]]   |   python -m te_assembly cp NAME DEST
       python -m te_assembly export CHECKPOINT_OR_RUN_DIR [DEST]

Hydra overrides select and change the config, e.g. model=residual_mlp recipe=mxfp8 model.dims.hidden=128;
your own files: model=path/to/my_model.yaml, or a folder with -cd DIR (DIR/model/*.yaml, DIR/recipe/*.yaml).
COMMAND --help lists that command's settings; -m sweeps (e.g. bench -m model.dims.hidden=64,128).

commands:
{commands}
"""


def usage() -> str:
    lines = "\n".join(f"  {name:<9} {doc}" for name, (_, doc) in COMMANDS.items())
    return USAGE.format(commands=lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    io: Consoles = consoles()
    try:
        return _main(args, io)
    except KeyboardInterrupt:
        io.err.print("interrupted", markup=False)
        return 130
    except BrokenPipeError:  # the reader went away (``... | head``): stop quietly, as Unix tools do
        _silence_stdout()
        return 141
    except Exception as exc:  # jobs have their own (cli/app.py); this one is for help and the command line
        return last_resort(exc, io)


def _main(args: list[str], io: Consoles) -> int:
    split = split_command(args)
    if split.unknown is not None and not split.wants_help:
        from te_assembly.diagnostics import did_you_mean, printable

        hint = did_you_mean(split.unknown, COMMANDS)
        message = f"error: unknown command {printable(repr(split.unknown))}" + (f" ({hint})" if hint else "")
        io.err.print(message, markup=False)
        io.err.print(usage(), markup=False)
        return 2
    if split.wants_help:
        from te_assembly.cli.help import print_help

        words = split.overrides()
        extra = words if isinstance(words, list) else []
        return print_help(split.command, [*split.hydra_args, *extra], io, usage())
    words = split.overrides()
    if isinstance(words, str):
        io.err.print(f"error: {words}", markup=False)
        return 2
    return run_command(split.command or DEFAULT_COMMAND, [*split.hydra_args, *words], io)


def _silence_stdout() -> None:
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def run() -> None:
    """The ``te-assembly`` executable and ``python -m te_assembly``: ``main``, then exit with its code.

    The objects still alive at exit (a parsed 10,000-step model, Hydra's config) are frozen first: the
    interpreter's final collector passes over them otherwise cost more than validating the model."""
    code = main()
    if code == 2:  # a config error: under torchrun, rank 0 reports it (parallel/launch.py)
        from te_assembly.analysis.parallel.launch import let_main_rank_report

        let_main_rank_report()
    import gc

    gc.freeze()
    raise SystemExit(code)


if __name__ == "__main__":
    run()
