"""``cp NAME DEST``: copy a shipped model, recipe or block (or one in a ``-cd`` folder) to edit it.

NAME is ``moe_block`` (any kind, when only one kind has that name) or ``model/moe_block``,
``recipe/fp8_delayed``. DEST is a folder, laid out for ``-cd`` (``DEST/model/moe_block.yaml``), or a
``.yaml`` file (its name becomes the config's ``name:``). An existing file is never overwritten. It says
where it wrote and how to use the copy.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from te_assembly.analysis.analyze import Analysis
from te_assembly.cli.commands.ls import config_roots, options
from te_assembly.config.locations import FILE_GROUPS, SUFFIXES, choice_stem
from te_assembly.diagnostics import did_you_mean, error, printable
from te_assembly.errors import ConfigError, OutputPathError
from te_assembly.files.write import file_mode, write_error
from te_assembly.sections import setting


@dataclass(frozen=True)
class CpSettings:
    """``cp:``: what to copy and where (``cp SOURCE DEST``)."""

    source: str | None = setting(
        None, nonempty=True, doc="what to copy: NAME, or GROUP/NAME (model/moe_block, recipe/fp8_delayed)"
    )
    dest: str | None = setting(
        None,
        nonempty=True,
        doc="a folder (the copy goes to DEST/GROUP/NAME.yaml, for -cd DEST) or a .yaml file",
    )


SECTIONS = {"cp": CpSettings}


def _source(text: str, roots: list[Path]) -> tuple[str, Path]:
    """(group, file) of ``text``; ``ConfigError`` with what exists when it is unknown or ambiguous."""
    group, _, name = text.rpartition("/")
    groups = [group] if group else list(FILE_GROUPS)
    if group and group not in FILE_GROUPS:
        hint = did_you_mean(group, FILE_GROUPS)
        message = f"cp copies a {', '.join(FILE_GROUPS)}; {group!r} is none of them"
        raise ConfigError([error("cp.source", "bad-choice", message, hint)])
    found = [(g, o.path) for g in groups for o in options(g, roots) if o.name == name and o.hidden_by is None]
    if len(found) == 1:
        return found[0]
    if found:
        shown = ", ".join(f"{g}/{name}" for g, _ in found)
        raise ConfigError(
            [
                error(
                    "cp.source",
                    "ambiguous",
                    f"{name!r} is a {' and a '.join(g for g, _ in found)}: say which, {shown}",
                )
            ]
        )
    names = sorted({f"{g}/{o.name}" for g in groups for o in options(g, roots)})
    hint = did_you_mean(text, names) or did_you_mean(name, sorted({n.split("/")[1] for n in names}))
    raise ConfigError(
        [
            error(
                "cp.source",
                "unknown-name",
                f"nothing named {text!r} to copy; there are: {', '.join(names)}",
                hint,
            )
        ]
    )


def _named(text: str, old: str, new: str) -> str:
    """The config's top-level ``name:`` set to the copy's own name (the rest of the file as it was)."""
    if old == new:
        return text
    value = new if re.fullmatch(r"[A-Za-z_][\w.-]*", new) else json.dumps(new)
    replaced, count = re.subn(
        r"^name:[^\n]*", f"name: {value}  # copied from {old}", text, count=1, flags=re.M
    )
    return replaced if count else text


def main(analysis: Analysis, console: Console) -> int:
    settings: CpSettings = analysis.section("cp")
    missing = [k for k in ("source", "dest") if getattr(settings, k) is None]
    if missing:
        diags = [
            error(f"cp.{k}", "missing", f"cp needs a {k.upper()}: cp model/moe_block my_configs")
            for k in missing
        ]
        raise ConfigError(diags)
    assert settings.source is not None and settings.dest is not None
    group, source = _source(settings.source, config_roots())
    dest = Path(settings.dest).expanduser()
    shipped = {o.name for o in options(group, config_roots()) if o.origin == "shipped"}
    if dest.suffix in SUFFIXES:
        target = dest
    else:
        # In a folder the copy is found by name, after the shipped configs: a shipped name would always
        # pick the shipped file, so the copy gets a name of its own (as torchtune's ``tune cp`` asks for).
        stem = source.stem if source.stem not in shipped else f"my_{source.stem}"
        target = dest / group / f"{stem}{source.suffix}"
    if target.exists() or target.is_symlink():
        raise OutputPathError(
            f"{target} already exists: cp never overwrites (remove it, or choose another DEST)"
        )
    text = _named(source.read_text(encoding="utf-8"), source.stem, choice_stem(target.name))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "x", encoding="utf-8") as f:  # "x": another process's file is never replaced
            f.write(text)
        target.chmod(file_mode())
    except FileExistsError:
        raise OutputPathError(f"{target} already exists: cp never overwrites") from None
    except OSError as exc:
        raise write_error(target, exc) from None
    stem = choice_stem(target.name)
    renamed = (
        f", named {stem}: {source.stem} is a shipped name"
        if stem != source.stem and dest.suffix not in SUFFIXES
        else ""
    )
    console.print(
        f"wrote {printable(str(target))} (a copy of {printable(str(source))}{printable(renamed)})",
        markup=False,
        soft_wrap=True,
    )
    by_file = dest.suffix in SUFFIXES
    if group == "block":  # a block is no choice of its own: a model's step uses it
        by_name = "" if by_file else f"block: {stem} (with -cd {dest}), or "
        console.print(
            f"use it from a model's ops, as a step with {printable(by_name)}block: {printable(str(target))}, "
            "then validate that model",
            markup=False,
            soft_wrap=True,
        )
        return 0
    use = f"{group}={target}" if by_file else f"-cd {dest} {group}={stem}"
    console.print(
        f"use it with: python -m te_assembly validate {printable(use)}", markup=False, soft_wrap=True
    )
    return 0
