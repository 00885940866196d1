"""Pass 2, blocks: each ``block:`` step of a model replaced in place by the steps of its uses, on plain
data (no OmegaConf node per op).

A block is an op list with its own dims, channels and public tensors: a file ``block/<name>.yaml`` in
any config folder (the shipped ``configs/``, ``DIR`` with ``-cd DIR``), an entry of the model's
``blocks:``, or a file by path (``block: layer.yaml``, relative to the model file). A model step

    - {name: layers, block: moe_layer, repeat: 4, dims: {hidden: 64}}

becomes the steps of 4 uses, ``layers.0.<step>`` ... ``layers.3.<step>``; each use's channels and public
tensors are scoped the same way (``layers.3.residual``, ``layers.3.aux_loss``), so no two uses meet. A
use's dims are the block's ``dims``, then the step's ``dims``, then its own (``uses: [{dims: {...}},
...]`` instead of ``repeat``). ``${block.dims.X}`` in the block resolves against them once per distinct
set of dims (24 identical layers: once), through the same ``Interpolator`` as the model.

The expanded model is an ordinary model: the analysis checks it like any other. ``Expansion.origins``
says where each of its steps came from, so that diagnostics point at the block's own file and line and
name the uses they concern (``analysis/origins.py``). Problems of a block step itself (no such block,
``repeat`` and ``uses`` both given...) are reported here, in the model's coordinates, and the step is
left unexpanded: the analysis then treats it as a step it cannot plan.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from te_assembly.config import interpolate, overrides
from te_assembly.config.block_names import related, scoped, use_path, use_ranges
from te_assembly.config.block_uses import BlockGroup, BlockUse
from te_assembly.config.locations import (
    is_path_choice,
    list_options,
    option_files,
    shadowed,
)
from te_assembly.config.source import Key, Source
from te_assembly.diagnostics import Diagnostic, did_you_mean, error, warning
from te_assembly.errors import ConfigError

MAX_STEPS = 200_000
"""Most steps a model may expand to (a 96-layer transformer is about 1,500): ``repeat: 1000000000``
is refused before anything is copied."""


@dataclass(frozen=True)
class BlockSource:
    """Where one block is defined, for file:line."""

    name: str
    prefix: str
    """The key path its root stands for: ``block.<name>`` for a file, ``model.blocks.<name>`` inline."""
    source: Source | None
    """The file it was read from; for an inline block, the model's."""

    @property
    def file(self) -> str | None:
        return self.source.file if self.source is not None else None

    def line(self, local: str) -> int | None:
        """The line of ``local`` (``ops[4].extra_inputs``), a key path inside the block."""
        if self.source is None:
            return None
        return self.source.lines.line(f"{self.prefix}.{local}" if local else self.prefix)


@dataclass(frozen=True)
class Origin:
    """Where a step of the expanded model came from."""

    position: int
    """Its (block) step's index in ``model.ops`` as written."""
    group: int
    """Index into ``Expansion.groups``; -1 for a step of the model's own."""
    use: int = 0
    local: int = 0
    """Index in the block's ``ops``."""


@dataclass(frozen=True)
class Expansion:
    model: dict[str, Any]
    """The model with every block step replaced by its uses' steps (and no ``blocks:``)."""
    groups: tuple[BlockGroup, ...]
    where: tuple[BlockSource, ...]
    """Where each group's block is defined."""
    origins: tuple[Origin, ...]
    """One per step of ``model["ops"]``."""
    sources: tuple[Source, ...] = ()
    """Block files read, in the order first used."""
    blocks: dict[str, Any] = field(default_factory=dict)
    """Each block used, by name, as the expansion read it (command-line ``block.*`` overrides applied):
    what ``--cfg job`` shows under ``block``."""


@dataclass
class Context:
    """What expanding needs besides the model."""

    roots: dict[str, Any]
    """Interpolation roots: every other section by name (``model`` included), as for the model."""
    model_source: Source | None = None
    search: Sequence[Path] = ()
    """Config folders, in Hydra's search-path order: ``block/<name>.yaml`` is looked up in each."""
    overrides: Sequence[Any] = ()
    """Hydra overrides below ``block.`` (``block.moe_layer.dims.ffn=256``), applied to that block."""
    inline_sites: Sequence[tuple[Key, ...]] = ()
    """Interpolation sites under the model's ``blocks:`` (relative to the model), left unresolved so far."""


def needs_expansion(model: Mapping[str, Any]) -> bool:
    ops = model.get("ops")
    return "blocks" in model or (
        isinstance(ops, list) and any(isinstance(op, dict) and op.get("block") is not None for op in ops)
    )


@dataclass
class _Block:
    """A block read and checked once, however many steps use it."""

    where: BlockSource
    data: dict[str, Any]
    sites: list[tuple[Key, ...]]
    usable: bool
    resolved: dict[str, tuple[list[Any], dict[str, Any], list[Diagnostic]]] = field(default_factory=dict)
    """Per distinct dims (as JSON): the block's ops and dims resolved, and what failed to resolve."""


@dataclass(frozen=True)
class _Uses:
    name: str
    block: _Block
    steps: list[list[Any]]
    """Each use's steps, scoped."""
    dims: list[dict[str, Any]]


class _Expander:
    def __init__(self, model: Mapping[str, Any], ctx: Context) -> None:
        self.model = model
        self.ctx = ctx
        self.diags: list[Diagnostic] = []
        self.blocks: dict[str, _Block | None] = {}
        """By reference as written (``moe_layer``, ``layer.yaml``)."""
        self.by_name: dict[str, str] = {}
        """Block name -> the reference it was first loaded by (two files of one name are refused)."""
        self.sources: list[Source] = []
        inline = model.get("blocks")
        self.inline: dict[str, Any] = dict(inline) if isinstance(inline, dict) else {}
        self.budget = MAX_STEPS

    # ------------------------------------------------------------------------------------ finding

    def find(self, ref: str, path: str) -> _Block | None:
        if ref in self.blocks:
            return self.blocks[ref]
        block = self._load(ref, path)
        if block is not None:
            first = self.by_name.setdefault(block.where.name, ref)
            if first != ref:
                message = f"another block named {block.where.name!r} is already used ({first!r})"
                self.diags.append(error(path, "duplicate-block-name", message, "rename one of the files"))
                block = None
        self.blocks[ref] = block
        return block

    def _load(self, ref: str, path: str) -> _Block | None:
        if ref in self.inline:
            sites = [s[2:] for s in self.ctx.inline_sites if len(s) > 2 and s[1] == ref]
            where = BlockSource(ref, f"model.blocks.{ref}", self.ctx.model_source)
            return self._checked(where, self.inline[ref], sites)
        try:
            location = self._locate(ref, path)
        except ConfigError as exc:  # found, but a symlink out of its config folder
            self.diags.extend(dataclasses.replace(d, path=path) for d in exc.diagnostics)
            return None
        if location is None:
            self.diags.append(self._not_found(ref, path))
            return None
        from te_assembly.config.source import read_source

        name = location.stem
        source = read_source(str(location), "block", prefix=f"block.{name}")
        if source not in self.sources:
            self.sources.append(source)
        self.diags.extend(source.diagnostics)
        if source.data is None:
            if source.ok:
                found = error(f"block.{name}", "empty-file", "the block file is empty")
                self.diags.append(found.located(source.file, None) if source.file else found)
            return None
        return self._checked(
            BlockSource(name, f"block.{name}", source), source.data, list(source.interpolations)
        )

    def _locate(self, ref: str, path: str) -> Path | None:
        if is_path_choice(ref):
            model_file = self.ctx.model_source.file if self.ctx.model_source is not None else None
            base = Path(model_file).parent if model_file and Path(model_file).is_file() else Path.cwd()
            candidate = Path(ref).expanduser()
            candidate = candidate if candidate.is_absolute() else base / candidate
            return candidate.resolve() if candidate.is_file() else None
        files = option_files("block", ref, self.ctx.search)
        twice = shadowed("block", ref, self.ctx.search, path)
        if twice is not None:
            self.diags.append(twice)
        return files[0] if files else None

    def _not_found(self, ref: str, path: str) -> Diagnostic:
        known = sorted({*self.inline, *list_options("block", self.ctx.search)})
        if is_path_choice(ref):
            message = f"no block file {ref!r} (a path is relative to the model file)"
            return error(path, "unknown-block", message)
        listed = ", ".join(known) or "none"
        message = f"no block {ref!r} (blocks: {listed}; or define it under the model's blocks:)"
        beside = self._beside_model(ref)
        if beside is not None:  # the user's own layout, not yet on the search path
            folder = beside.parent.parent
            hint = f"{beside} is there: add -cd {folder} (a folder laid out like configs/)"
            hint += f", or write block: {beside}"
            return error(path, "unknown-block", message, hint)
        return error(path, "unknown-block", message, did_you_mean(ref, known))

    def _beside_model(self, ref: str) -> Path | None:
        """``<folder>/block/<ref>.yaml`` next to the model file's folder (``DIR/model/m.yaml`` and
        ``DIR/block/<ref>.yaml``), or in it: where a user keeps the blocks a model names."""
        model_file = self.ctx.model_source.file if self.ctx.model_source is not None else None
        if not model_file or not Path(model_file).is_file():
            return None
        here = Path(model_file).resolve().parent
        for folder in (here.parent, here):
            for suffix in (".yaml", ".yml"):
                candidate = folder / "block" / f"{ref}{suffix}"
                if candidate.is_file():
                    return candidate
        return None

    def _checked(self, where: BlockSource, data: Any, sites: list[tuple[Key, ...]]) -> _Block | None:
        """The block's own structure, checked once; usable when its steps can be expanded."""
        from te_assembly.config.schema import BlockConfig, check_structure

        def located(d: Diagnostic) -> Diagnostic:
            return where.source.locate(d) if where.source is not None else d

        if not isinstance(data, dict):
            message = f"a block must be a mapping, got {type(data).__name__}"
            self.diags.append(located(error(where.prefix, "wrong-type", message)))
            return None
        data = self._overridden(where, data, sites)
        self.diags.extend(located(d) for d in check_structure(BlockConfig, data, where.prefix))
        ops = data.get("ops")
        usable = isinstance(ops, list) and bool(ops)
        if isinstance(ops, list) and not ops:
            message = "a block needs at least one step"
            self.diags.append(located(error(f"{where.prefix}.ops", "empty-block", message)))
        for k, op in enumerate(ops if isinstance(ops, list) else []):
            if isinstance(op, dict) and op.get("block") is not None:
                message = "a block's steps are ops and modules: a block cannot use another block"
                hint = "use both blocks from the model, one after the other"
                self.diags.append(
                    located(error(f"{where.prefix}.ops[{k}].block", "nested-block", message, hint))
                )
                usable = False
        own = data.get("name")
        if isinstance(own, str) and own != where.name:
            message = f"used as block {where.name!r} (its file name or blocks: key) but named {own!r}"
            self.diags.append(located(warning(f"{where.prefix}.name", "block-name", message)))
        if not isinstance(data.get("dims", {}), dict):
            data = {**data, "dims": {}}
        return _Block(where, data, sites, usable)

    def _overridden(
        self, where: BlockSource, data: dict[str, Any], sites: list[tuple[Key, ...]]
    ) -> dict[str, Any]:
        prefix = f"block.{where.name}"
        mine = [o for o in self.ctx.overrides if o.key_or_group.startswith(prefix + ".")]
        if not mine:
            return data
        applied = overrides.apply(data, mine, prefix)
        sites[:] = [s for s in interpolate.find_sites(applied.data)]
        self.diags.extend(applied.diagnostics)
        return dict(applied.data) if isinstance(applied.data, dict) else data

    # ------------------------------------------------------------------------------------ expanding

    def step(self, j: int, op: dict[str, Any], names: Sequence[tuple[int, Any]]) -> _Uses | None:
        """The uses of block step ``model.ops[j]``; None to leave the step as it is (what is wrong is
        reported, here or by the analysis)."""
        path = f"model.ops[{j}]"
        ref, name = op.get("block"), op.get("name")
        if not isinstance(ref, str) or not isinstance(name, str):
            return None  # the structural check reports the type
        if not ref.strip():
            self.diags.append(
                error(f"{path}.block", "unknown-block", "block names no block (an empty string)")
            )
            return None
        kinds = [k for k in ("op", "module") if op.get(k) is not None]
        if kinds:
            message = f"a step is one of op, module or block; this one also has {kinds[0]!r}"
            self.diags.append(error(f"{path}.block", "op-or-module", message))
            return None
        from te_assembly.config.schema import is_step_name

        if not is_step_name(name) or any(related(name, other) for i, other in names if i != j):
            return None  # the analysis reports the name (bad, duplicate, or another's scope)
        uses = self._uses(op, path)
        block = self.find(ref, f"{path}.block")
        if uses is None or block is None or not block.usable:
            return None
        declared = block.data.get("dims") or {}
        step_dims = op.get("dims") or {}
        self._unknown_dims(step_dims, declared, f"{path}.dims", block.where.name)
        for u, use_dims in enumerate(uses):
            self._unknown_dims(use_dims, declared, f"{path}.uses[{u}].dims", block.where.name)
        steps_per_use = len(block.data["ops"])
        if steps_per_use * len(uses) > self.budget:
            message = (
                f"{len(uses)} uses of {steps_per_use} steps expand past {MAX_STEPS:,} steps in all (the most "
                "a model may have)"
            )
            self.diags.append(
                error(
                    f"{path}.{'uses' if op.get('uses') is not None else 'repeat'}", "too-many-steps", message
                )
            )
            return None
        self.budget -= steps_per_use * len(uses)
        resolved: list[tuple[list[Any], dict[str, Any]]] = []
        failures: dict[tuple[str, str, str, str | None], tuple[Diagnostic, list[int]]] = {}
        # A command-line block.<name>.dims.X=V is the user's last word: it wins over the step's and the
        # uses' dims too (otherwise a model that sets X would ignore it without a word).
        forced = {k: declared[k] for k in self._overridden_dims(block.where.name) if k in declared}
        for u, use_dims in enumerate(uses):
            merged = {**declared, **step_dims, **use_dims, **forced}
            ops, dims, found = self._resolve(block, merged, step_dims.keys() | use_dims.keys())
            resolved.append((ops, dims))
            for d in found:  # one diagnostic per distinct failure, naming every use it concerns
                failures.setdefault((d.path, d.code, d.message, d.hint), (d, []))[1].append(u)
        self.diags.extend(_in_uses(d, name, block.where, affected) for d, affected in failures.values())
        steps = [scoped(ops, f"{name}.{u}.") for u, (ops, _) in enumerate(resolved)]
        return _Uses(name, block, steps, [dims for _, dims in resolved])

    def _overridden_dims(self, block: str) -> set[str]:
        """The dims of ``block`` that command-line overrides set (``block.<block>.dims.X=...``)."""
        prefix = f"block.{block}.dims."
        return {
            o.key_or_group[len(prefix) :].split(".")[0]
            for o in self.ctx.overrides
            if o.key_or_group.startswith(prefix) and not o.is_delete()
        }

    def _uses(self, op: dict[str, Any], path: str) -> list[dict[str, Any]] | None:
        repeat, uses = op.get("repeat"), op.get("uses")
        if repeat is not None and uses is not None:
            message = "give repeat (that many uses alike) or uses (one item per use), not both"
            self.diags.append(error(f"{path}.uses", "repeat-and-uses", message))
            return None
        step_dims = op.get("dims")
        if step_dims is not None and not isinstance(step_dims, dict):
            return None  # the structural check reports it
        if uses is not None:
            if not isinstance(uses, list) or not all(isinstance(u, dict) for u in uses):
                return None
            if not uses:
                self.diags.append(error(f"{path}.uses", "no-uses", "uses is empty: give at least one use"))
                return None
            dims = [u.get("dims") or {} for u in uses]
            return dims if all(isinstance(d, dict) for d in dims) else None
        if repeat is None:
            return [{}]
        if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
            return None  # the structural check reports it
        if repeat > MAX_STEPS:
            message = f"repeat={repeat:,} is more uses than a model may have steps ({MAX_STEPS:,})"
            self.diags.append(error(f"{path}.repeat", "too-many-steps", message))
            return None
        return [{}] * repeat

    def _unknown_dims(
        self, given: Mapping[str, Any], declared: Mapping[str, Any], path: str, block: str
    ) -> None:
        for key in given:
            if key not in declared:
                listed = ", ".join(declared) or "none"
                message = f"block {block!r} has no dim {key!r} (its dims: {listed})"
                self.diags.append(error(f"{path}.{key}", "unknown-dim", message, did_you_mean(key, declared)))

    def _resolve(
        self, block: _Block, dims: dict[str, Any], given: Any
    ) -> tuple[list[Any], dict[str, Any], list[Diagnostic]]:
        key = json.dumps(dims, sort_keys=True, default=repr)
        cached = block.resolved.get(key)
        if cached is not None:
            return cached
        sites = [
            s
            for s in block.sites
            if s and s[0] in ("ops", "dims") and not (s[0] == "dims" and len(s) > 1 and s[1] in given)
        ]
        root = {**block.data, "dims": dims, "name": block.where.name}
        resolver = interpolate.Interpolator({**self.ctx.roots, "block": root})
        data, found = interpolate.resolve_sites(resolver, "block", sites, block.where.prefix)
        result = (list(data["ops"]), dict(data["dims"]), found)
        block.resolved[key] = result
        return result


def _in_uses(diag: Diagnostic, group: str, where: BlockSource, uses: Sequence[int]) -> Diagnostic:
    """A diagnostic found at a key path of the block (``block.moe_layer.ops[4]...``), for these uses."""
    local = diag.path[len(where.prefix) + 1 :] if diag.path.startswith(where.prefix + ".") else diag.path
    moved = Diagnostic(
        diag.severity, use_path(group, where.name, uses, local), diag.message, diag.code, diag.hint
    )
    return moved.located(where.file, where.line(local))


def expand(model: Mapping[str, Any], ctx: Context) -> tuple[Expansion, list[Diagnostic]]:
    """The model with its block steps expanded (see the module docstring), and what is wrong with them."""
    expander = _Expander(model, ctx)
    raw_ops = model.get("ops")
    ops = raw_ops if isinstance(raw_ops, list) else []
    names = [(j, op.get("name")) for j, op in enumerate(ops) if isinstance(op, dict)]
    flat: list[Any] = []
    origins: list[Origin] = []
    groups: list[BlockGroup] = []
    where: list[BlockSource] = []
    for j, op in enumerate(ops):
        expanded = (
            expander.step(j, op, names) if isinstance(op, dict) and op.get("block") is not None else None
        )
        if expanded is None:
            flat.append(op)
            origins.append(Origin(j, -1))
            continue
        g = len(groups)
        records = []
        for u, (steps, dims) in enumerate(zip(expanded.steps, expanded.dims, strict=True)):
            records.append(BlockUse(u, len(flat), len(steps), dims))
            origins.extend(Origin(j, g, u, k) for k in range(len(steps)))
            flat.extend(steps)
        block = expanded.block.where
        groups.append(BlockGroup(expanded.name, block.name, j, block.file, tuple(records)))
        where.append(block)
    expander.diags.extend(_unused_overrides(ctx.overrides, expander.by_name))
    out = {k: v for k, v in model.items() if k != "blocks"}
    if isinstance(raw_ops, list):
        out["ops"] = flat
    used = {b.where.name: b.data for b in expander.blocks.values() if b is not None}
    expansion = Expansion(out, tuple(groups), tuple(where), tuple(origins), tuple(expander.sources), used)
    return expansion, expander.diags


def _unused_overrides(given: Sequence[Any], used: Mapping[str, str]) -> list[Diagnostic]:
    out = []
    for o in given:
        name = o.key_or_group.split(".")[1] if o.key_or_group.count(".") >= 1 else ""
        if name in used and o.key_or_group == f"block.{name}":
            message = (
                f"cannot apply {o.input_line!r}: a block is changed key by key "
                f"(block.{name}.dims.X=V, block.{name}.ops.N.args.A=V), not replaced or removed"
            )
            out.append(error(f"block.{name}", "bad-override", message))
        elif name not in used:
            listed = ", ".join(sorted(used)) or "none"
            message = (
                f"cannot apply {o.input_line!r}: the model uses no block {name!r} (blocks it uses: {listed})"
            )
            out.append(
                error(f"block.{name}" if name else "block", "bad-override", message, did_you_mean(name, used))
            )
    return out


__all__ = [
    "MAX_STEPS",
    "BlockSource",
    "Context",
    "Expansion",
    "Origin",
    "expand",
    "needs_expansion",
    "use_path",
    "use_ranges",
]
