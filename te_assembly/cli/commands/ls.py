"""``ls [WHAT [NAME]]``: what a config can choose. Without WHAT: the models, blocks and recipes
(shipped ones and those in your folders, ``-cd DIR``, each marked with where it comes from) and the ops
and modules of the catalog. ``ls models`` (``blocks``, ``recipes``, ``ops``) lists one kind;
``ls op GroupedLinear`` shows an op: its arguments with types and defaults, its extra input and output
slots in TE's order, its width rule, its TE and reference classes, all from the catalog;
``ls model moe_block`` (``recipe``, ``block``) shows where that file is and what it holds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from te_assembly.analysis.analyze import Analysis
from te_assembly.catalog import MODULE_ALLOWLIST, OPS, ModuleSpec, OpSpec
from te_assembly.config.locations import FILE_GROUPS, SUFFIXES, configs_dir, group_dir
from te_assembly.diagnostics import did_you_mean, error, printable
from te_assembly.errors import ConfigError
from te_assembly.files.read import LIMITS, InputFileError, read_text
from te_assembly.sections import setting
from te_assembly.views.op_sheet import op_sheet


@dataclass(frozen=True)
class LsSettings:
    """``ls:``: what to list (``ls [models|recipes|blocks|ops]``, ``ls op NAME``)."""

    what: str | None = setting(
        None,
        nonempty=True,
        doc="models, blocks, recipes, ops (null: all); model, block, recipe, op with a NAME",
    )
    name: str | None = setting(None, nonempty=True, doc="show this one in detail")


SECTIONS = {"ls": LsSettings}
CATALOG_KINDS = ("op", "module")


def _kind(what: str) -> str | None:
    """``models`` -> ``model``: a file group, ``op``/``module``, or None."""
    for kind in (*FILE_GROUPS, *CATALOG_KINDS):
        if what in (kind, f"{kind}s"):
            return kind
    return None


@dataclass(frozen=True)
class Option:
    group: str
    name: str
    path: Path
    origin: str
    """``shipped``, or the folder it was found in."""
    hidden_by: Path | None = None
    """A file of the same name earlier on the search path (which ``GROUP=NAME`` picks)."""


def config_roots() -> list[Path]:
    """The config folders on this job's search path, in Hydra's order (shipped configs, then ``-cd``
    folders and ``hydra.searchpath`` entries)."""
    from hydra.core.hydra_config import HydraConfig

    roots: list[Path] = []
    for source in HydraConfig.get().runtime.config_sources or []:
        if source.schema == "file" and Path(str(source.path)).is_dir():
            root = Path(str(source.path)).resolve()
            if root not in roots:
                roots.append(root)
    return roots or [configs_dir().resolve()]


def options(group: str, roots: list[Path]) -> list[Option]:
    """Every option of ``group`` in every folder, in search-path order; a name found again later is
    marked as hidden by the first."""
    shipped = configs_dir().resolve()
    first: dict[str, Path] = {}
    found: list[Option] = []
    for root in roots:
        folder = group_dir(root, group)
        if not folder.is_dir():
            continue
        origin = "shipped" if root == shipped else str(root)
        for path in sorted(folder.iterdir()):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            hidden = first.get(path.stem)
            first.setdefault(path.stem, path)
            found.append(Option(group, path.stem, path, origin, hidden))
    return found


def _text(path: Path) -> str:
    """A config file's text through the shared bounded reader, inside the folder it was found in (a
    symlink out of it is refused: ``ls`` shows nothing of a file elsewhere)."""
    return read_text(path, limit=LIMITS["config"], within=path.parent)


def _description(path: Path) -> str:
    """A file's top-level ``description:`` (nothing is parsed; "" for a file that cannot be read)."""
    try:
        head = _text(path)[:65536]
    except InputFileError:
        return ""
    match = re.search(r"^description:\s*(.+)$", head, re.M)
    return match.group(1).strip().strip("'\"") if match else ""


def group_table(group: str, found: list[Option]) -> Table:
    table = Table(title=f"{group}s ({group}=NAME, or {group}=path/to/file.yaml)", title_justify="left")
    for column in ("name", "from", "description"):
        table.add_column(column)
    for option in found:
        origin = option.origin
        if option.hidden_by is not None:
            origin += f" (hidden by {option.hidden_by}: use {group}={option.path})"
        table.add_row(
            Text(printable(option.name)), Text(printable(origin)), Text(printable(_description(option.path)))
        )
    return table


def _slots(spec: OpSpec) -> str:
    ins = ", ".join(s.name for s in spec.inputs) or "-"
    outs = ", ".join(s.name for s in spec.outputs) or "-"
    return f"{ins} -> {outs}"


def catalog_table() -> Table:
    table = Table(
        title="ops (op: NAME in a step; module: NAME for a torch module that ends a fuser)",
        title_justify="left",
    )
    for column in ("name", "kind", "TE class", "extra inputs -> outputs", "what it does"):
        table.add_column(column)
    for spec in OPS.values():
        te = spec.te_class.rsplit(":", 1)[-1] if spec.te_class else "(ours)"
        table.add_row(*map(Text, (spec.name, "op", te, _slots(spec), spec.doc)))
    for module in MODULE_ALLOWLIST.values():
        doc = f"{module.doc} ({module.torch_class.replace(':', '.')})"
        table.add_row(*map(Text, (module.name, "module", "-", "-", doc)))
    return table


def op_tables(spec: OpSpec | ModuleSpec) -> list[Table | str]:
    """One op or module as the catalog declares it (``views/op_sheet.py``), as rich tables."""
    out: list[Table | str] = []
    for part in op_sheet(spec):
        if isinstance(part, str):
            out.append(part)
            continue
        table = Table(title=part.title, title_justify="left")
        for column in part.columns:
            table.add_column(column)
        for row in part.rows:
            table.add_row(*map(Text, row))
        out.append(table)
    return out


def _unknown(path: str, kind: str, name: str, names: list[str]) -> ConfigError:
    message = f"no {kind} named {name!r}; there are: {', '.join(names) or 'none'}"
    return ConfigError([error(path, "unknown-name", message, did_you_mean(name, names))])


def main(analysis: Analysis, console: Console) -> int:
    settings: LsSettings = analysis.section("ls")
    kinds = [*FILE_GROUPS, *CATALOG_KINDS]
    kind = _kind(settings.what) if settings.what is not None else None
    if settings.what is not None and kind is None:
        listed = ", ".join(f"{k}s" for k in kinds)
        hint = did_you_mean(settings.what, [f"{k}s" for k in kinds] + kinds)
        raise ConfigError([error("ls.what", "bad-choice", f"ls lists {listed}; got {settings.what!r}", hint)])
    if settings.name is not None and kind is None:
        raise ConfigError(
            [error("ls.name", "conflicting-settings", "ls NAME needs WHAT first: ls op GroupedLinear")]
        )
    roots = config_roots()
    if settings.name is not None and kind is not None:
        return _show_one(kind, settings.name, roots, console)
    for group in FILE_GROUPS:
        if kind in (None, group):
            found = options(group, roots)
            if found:
                console.print(group_table(group, found))
            else:  # an empty table says less than a line
                console.print(
                    f"{group}s: none found (your own go in DIR/{group}/*.yaml, with -cd DIR)", markup=False
                )
    if kind in (None, "op", "module"):
        console.print(catalog_table())
    if kind is None:
        console.print(
            "ls op NAME shows an op's arguments, slots and width rule; cp NAME DIR copies a config to edit",
            markup=False,
        )
    return 0


def _show_one(kind: str, name: str, roots: list[Path], console: Console) -> int:
    if kind in CATALOG_KINDS:
        mine, other = (OPS, MODULE_ALLOWLIST) if kind == "op" else (MODULE_ALLOWLIST, OPS)
        spec: OpSpec | ModuleSpec | None = mine.get(name) or other.get(name)
        if spec is None:
            raise _unknown("ls.name", kind, name, list(mine))
        for part in op_tables(spec):
            console.print(part if isinstance(part, Table) else Text(part))
        return 0
    found = [o for o in options(kind, roots) if o.name == name]
    if not found:
        raise _unknown("ls.name", kind, name, sorted({o.name for o in options(kind, roots)}))
    chosen = found[0]
    console.print(Text(f"{kind} {name}: {chosen.path} ({chosen.origin}; what {kind}={name} picks)"))
    for hidden in found[1:]:
        console.print(Text(f"also {hidden.path} ({hidden.origin}): hidden, use {kind}={hidden.path}"))
    console.print(Text(printable(_text(chosen.path), keep_newlines=True)))
    return 0
