"""Entry point: pick the command, compose the config with Hydra, map typed errors to exit codes.

Exit codes: 0 ok, 1 runtime failure (verify mismatch, non-finite loss, engine unavailable),
2 config or composition error. No Python traceback for any error te_assembly raises on purpose.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

from omegaconf.errors import GrammarParseError, InterpolationResolutionError, MissingMandatoryValue
from rich.console import Console

from te_assembly.errors import CompositionError, ConfigError, TeAssemblyError

# A value OmegaConf could not resolve when a command read it (``${oc.env:NOPE}``, ``???``). Commands check
# the keys they read; this catches any they read raw, as a config error rather than a traceback.
UNRESOLVED = (InterpolationResolutionError, MissingMandatoryValue, GrammarParseError)

COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("te_assembly.cli.commands.run", "build the model and run a few forward+backward steps (default)"),
    "validate": ("te_assembly.cli.commands.validate", "check the config; exit 2 with every error"),
    "explain": ("te_assembly.cli.commands.explain", "print the resolved plan, channels and call signature"),
    "graph": ("te_assembly.cli.commands.graph", "draw the channel graph (Mermaid, DOT, SVG/PNG)"),
    "verify": ("te_assembly.cli.commands.verify", "compare the TE engine against the reference engine"),
    "train": ("te_assembly.cli.commands.train", "train the block on a synthetic teacher task"),
    "bench": ("te_assembly.cli.commands.bench", "time forward, backward and step"),
}

USAGE = """usage: python -m te_assembly [COMMAND] [KEY=VALUE ...]

Hydra overrides select and change the config, e.g. model=residual_mlp recipe=mxfp8 model.dims.hidden=128.

commands:
{commands}
"""


def usage() -> str:
    lines = "\n".join(f"  {name:<9} {doc}" for name, (_, doc) in COMMANDS.items())
    return USAGE.format(commands=lines)


def unresolved_message(exc: Exception) -> str:
    """OmegaConf's first line, with the config key it names (its message adds internals after it)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    key = getattr(exc, "full_key", None)
    return f"{key}: cannot resolve value: {first}" if key else f"cannot resolve config value: {first}"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    # Piped output (CI logs, tests) gets a wide fixed width so tables are not folded at 80 columns.
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 140)
    err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 140)
    if any(a in ("-h", "--help") for a in args) or args[:1] == ["help"]:
        console.print(usage(), markup=False)
        return 0
    command = "run"
    if args and "=" not in args[0]:
        command = args.pop(0)
        if command not in COMMANDS:
            from te_assembly.diagnostics import did_you_mean

            hint = did_you_mean(command, COMMANDS)
            err.print(f"error: unknown command {command!r}" + (f" ({hint})" if hint else ""), markup=False)
            err.print(usage(), markup=False)
            return 2
    module = importlib.import_module(COMMANDS[command][0])
    # Under torchrun only rank 0 prints tables and progress; every rank's errors say which rank it is.
    from te_assembly.parallel.launch import current_launch, rank_consoles

    console, err = rank_consoles(console, err)
    try:
        return int(module.main(args, console))
    except ConfigError as exc:
        from te_assembly.cli.report import print_diagnostics

        if current_launch().is_main:  # every rank reads the same config: one copy of its findings
            print_diagnostics(exc.diagnostics, err)
        return 2
    except CompositionError as exc:
        err.print(f"error: {exc}", markup=False)
        return 2
    except UNRESOLVED as exc:
        err.print(f"error: {unresolved_message(exc)}", markup=False)
        return 2
    except TeAssemblyError as exc:
        err.print(f"error: {exc}", markup=False)
        return 1
    except KeyboardInterrupt:
        err.print("interrupted", markup=False)
        return 130
    except Exception as exc:  # a fault no check foresaw: one line and exit 1, never a traceback
        if os.environ.get("TE_ASSEMBLY_TRACEBACK") == "1":
            raise
        err.print(f"error: {fault_message(exc)}", markup=False)
        return 1


def fault_message(exc: Exception) -> str:
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


if __name__ == "__main__":
    raise SystemExit(main())
