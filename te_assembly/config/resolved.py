"""Pass 2 of the config pipeline: plain, resolved data for the model, the recipe and every settings
section, with the problems found while getting there.

From a Hydra composition (``composition.py``: file groups arrive as stubs), each file-group option is read
once (``source.py``), anything other configs merged under it is merged in, its held-back overrides are
applied (``overrides.py``) and its interpolations resolved (``interpolate.py``). Settings sections are
small and come from Hydra's own composition, resolved leaf by leaf. From Python, a mapping takes the
model file's place. Nothing here checks what the values mean: that is the analysis (``analysis/``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from te_assembly.config import interpolate, overrides
from te_assembly.config.blocks import Context, Expansion, expand, needs_expansion
from te_assembly.config.locations import FILE_GROUPS, shadowed, shipped_roots
from te_assembly.config.source import Key, Source, read_source
from te_assembly.diagnostics import Diagnostic, error

log = logging.getLogger(__name__)

CHOSEN_GROUPS = ("model", "recipe")
"""File groups chosen on the command line (``model=NAME``); blocks are used by the model's steps."""


@dataclass(frozen=True)
class ResolvedConfig:
    """Everything a command reads, as plain data. ``model``/``recipe`` are None when there is none
    (``recipe=null``) or when it could not be read (``diagnostics`` says why)."""

    model: dict[str, Any] | None
    recipe: dict[str, Any] | None
    settings: dict[str, Any] = field(default_factory=dict)
    """Every other top-level key: ``engine``, ``seed``, ``run``, ``train``..., resolved."""
    sources: dict[str, Source] = field(default_factory=dict)
    """The files read (``model``, ``recipe``, ``config``): for file:line."""
    diagnostics: tuple[Diagnostic, ...] = ()
    """Problems found while loading: file syntax and limits, overrides, interpolations."""
    overrides: tuple[str, ...] = ()
    """The command-line overrides of this run (of this job, in a sweep)."""
    choices: dict[str, str | None] = field(default_factory=dict)
    """The option chosen for each file group (``moe_block``, ``path/to/x.yaml``), None for null."""
    config_dirs: tuple[str, ...] = ()
    expansion: Expansion | None = None
    """The model with its block steps expanded (``blocks.py``); None for a model without any."""

    @property
    def expanded_model(self) -> dict[str, Any] | None:
        """The model the analysis checks: its block steps expanded into their uses' steps."""
        return self.expansion.model if self.expansion is not None else self.model

    def file_of(self, group: str) -> str | None:
        source = self.sources.get(group)
        return source.file if source is not None else None

    def as_config(self) -> dict[str, Any]:
        """The whole config as the commands read it: the model and the recipe as read (overrides and
        interpolations applied), then every settings section, resolved. A run directory's
        ``config.yaml`` holds it, and ``te_assembly.load()`` takes it back as a mapping."""
        return {"model": self.model, "recipe": self.recipe, **self.settings}


# ------------------------------------------------------------------------------------------- resolving


@dataclass
class _Group:
    data: Any
    source: Source | None
    sites: list[tuple[Key, ...]]
    diagnostics: list[Diagnostic]


def _from_stub(group: str, node: Any) -> _Group:
    """A file group's data from the node Hydra composed for it."""
    from omegaconf import OmegaConf

    from te_assembly.config.composition import STUB_KEYS

    plain = OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else node
    if not isinstance(plain, Mapping) or "_source_" not in plain:
        # Written inline in a config, or registered from Python: Hydra's node is the data itself.
        return _Group(plain, None, interpolate.find_sites(plain), [])
    source = read_source(str(plain["_source_"]), group)
    patch = {k: v for k, v in plain.items() if k not in STUB_KEYS}
    data, sites = source.data, list(source.interpolations)
    if patch and isinstance(data, Mapping):
        data = overrides.merge(data, patch)
        sites = interpolate.find_sites(data)
    return _Group(data, source, sites, list(source.diagnostics))


def _shape_check(group: str, g: _Group) -> None:
    """A model or recipe file holds a mapping; anything else is reported once, here."""
    if g.data is None and g.source is not None and g.source.ok:
        found = error(group, "empty-file", f"the {group} file is empty")
        g.diagnostics.append(found.located(g.source.file, None) if g.source.file else found)
    elif g.data is not None and not isinstance(g.data, Mapping):
        message = f"a {group} file must be a mapping, got {type(g.data).__name__}"
        diag = error(group, "wrong-type", message)
        g.diagnostics.append(diag.located(g.source.file, 1) if g.source is not None else diag)
    else:
        return
    g.data = None


def _apply_overrides(group: str, g: _Group, parsed: Sequence[Any]) -> None:
    mine = [o for o in parsed if overrides.held_back(o, (group,))]
    if not mine:
        return
    if g.data is None:
        if g.source is None:  # no option chosen at all (``model=null``)
            for o in mine:
                message = f"cannot apply {o.input_line!r}: no {group} is chosen"
                g.diagnostics.append(error(group, "bad-override", message))
        return
    applied = overrides.apply(g.data, mine, group)
    g.data = applied.data
    g.sites = [s for s in g.sites if _still_there(g.data, s)] + list(applied.sites)
    g.diagnostics.extend(applied.diagnostics)


def _still_there(data: Any, keys: tuple[Key, ...]) -> bool:
    node = data
    for key in keys:
        if isinstance(node, Mapping) and str(key) in node:
            node = node[str(key)]
        elif isinstance(node, list) and isinstance(key, int) and key < len(node):
            node = node[key]
        else:
            return False
    return isinstance(node, str) and "${" in node


def _finish(
    groups: dict[str, _Group],
    settings_raw: dict[str, Any],
    early: list[Diagnostic],
    extra_sources: dict[str, Source],
    parsed_overrides: Sequence[Any],
    choices: dict[str, str | None],
    config_dirs: Sequence[str],
    search: Sequence[Path] | None = None,
) -> ResolvedConfig:
    """Overrides, then every interpolation of the model, the recipe and the settings, in one pass: each
    section is a root of the same ``Interpolator``, so ``bench.tokens: ${mul:4,${model.dims.hidden}}``
    and ``${seed}`` in a model resolve alike. Then the model's block steps are expanded (``blocks.py``;
    ``search``: the config folders holding ``block/``, shipped and ``config_dirs`` by default)."""
    for name, g in groups.items():
        _shape_check(name, g)
        _apply_overrides(name, g, parsed_overrides)
    roots = {**settings_raw, **{name: g.data for name, g in groups.items() if g.data is not None}}
    resolver = interpolate.Interpolator(roots)
    diags: list[Diagnostic] = list(early)
    data, inline_sites = _resolve_groups(resolver, groups, diags)
    settings: dict[str, Any] = {}
    for key, raw in settings_raw.items():
        value, found = interpolate.resolve_sites(resolver, key, interpolate.find_sites(raw), key)
        diags.extend(found)
        if value is not interpolate.DROPPED:
            settings[key] = value
    sources = {name: g.source for name, g in groups.items() if g.source is not None}
    sources.update(extra_sources)
    folders = list(search) if search is not None else [*shipped_roots(), *map(Path, config_dirs)]
    for name in ("model", "recipe"):
        choice = choices.get(name)
        twice = shadowed(name, choice, folders, name) if choice and name in sources else None
        if twice is not None:
            diags.append(twice)
    model_group = groups.get("model")
    ctx = Context(
        roots=resolver.roots,
        model_source=model_group.source if model_group is not None else None,
        search=folders,
        overrides=[o for o in parsed_overrides if overrides.held_back(o, ("block",))],
        inline_sites=inline_sites,
    )
    expansion = _expanded(data.get("model"), ctx, diags)
    return ResolvedConfig(
        model=data.get("model"),
        recipe=data.get("recipe"),
        settings=settings,
        sources=sources,
        diagnostics=tuple(_locate(d, sources) for d in diags),
        overrides=tuple(o.input_line for o in parsed_overrides),
        choices=choices,
        config_dirs=tuple(config_dirs),
        expansion=expansion,
    )


def _resolve_groups(
    resolver: interpolate.Interpolator, groups: dict[str, _Group], diags: list[Diagnostic]
) -> tuple[dict[str, Any], list[tuple[Key, ...]]]:
    """Each group (model, recipe) with its interpolations resolved, and the model's ``blocks:`` sites,
    left for each use of the block (``${block.dims.X}``)."""
    data: dict[str, Any] = {}
    inline_sites: list[tuple[Key, ...]] = []
    for name, g in groups.items():
        diags.extend(g.diagnostics)
        if g.data is None:
            data[name] = None
            continue
        sites = sorted(set(g.sites), key=_site_key)
        if name == "model":  # a block defined in the model resolves per use, with ``${block.dims.X}``
            inline_sites = [s for s in sites if s and s[0] == "blocks"]
            sites = [s for s in sites if not (s and s[0] == "blocks")]
        value, found = interpolate.resolve_sites(resolver, name, sites, name)
        data[name] = value
        diags.extend(found)
    return data, inline_sites


def _expanded(model: Any, ctx: Context, diags: list[Diagnostic]) -> Any:
    """The model's block steps expanded into their uses (``blocks.py``), or None when it has none."""
    if not isinstance(model, Mapping) or not (needs_expansion(model) or ctx.overrides):
        return None
    expansion, found = expand(model, ctx)
    diags.extend(found)
    return expansion


def _site_key(keys: tuple[Key, ...]) -> list[tuple[int, Any]]:
    return [(0, k) if isinstance(k, int) else (1, k) for k in keys]


def _locate(diag: Diagnostic, sources: Mapping[str, Source]) -> Diagnostic:
    for source in sources.values():
        diag = source.locate(diag)
        if diag.file is not None:
            return diag
    return diag


def _parse(overrides_: Sequence[str]) -> list[Any]:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides(overrides=list(overrides_)) if overrides_ else []


def resolve_composed(
    cfg: Any, task_overrides: Sequence[str], config_dirs: Sequence[str] = (), hydra: Any = None
) -> ResolvedConfig:
    """Pass 2 for a Hydra composition (``cfg``, file groups as stubs) and the overrides of this job
    (``hydra.overrides.task``), whose file-group value overrides Hydra held back. ``hydra``: Hydra's
    own node when ``cfg`` has none (a job's config: ``HydraConfig.get()``)."""
    from omegaconf import OmegaConf

    from te_assembly.config.composition import config_files

    parsed = _parse(task_overrides)
    hydra_node = hydra if hydra is not None else cfg.get("hydra")
    groups = {
        name: _from_stub(name, cfg.get(name)) if cfg.get(name) is not None else _Group(None, None, [], [])
        for name in CHOSEN_GROUPS
    }
    choices = {
        name: OmegaConf.select(hydra_node, f"runtime.choices.{name}", default=None) for name in CHOSEN_GROUPS
    }
    early: list[Diagnostic] = []
    if cfg.get("block") is not None:
        message = "a block is not chosen on the command line: a model uses it in a step (block: NAME)"
        early.append(error("block", "bad-override", message, "drop the block= override"))
    unresolved = OmegaConf.to_container(cfg, resolve=False)  # reading cfg[k] would resolve interpolations
    assert isinstance(unresolved, dict)
    settings_raw = {str(k): v for k, v in unresolved.items() if k not in FILE_GROUPS and k != "hydra"}
    extra: dict[str, Source] = {}
    # Settings are located in the primary config first (a user's ``-cn experiment``), then in the
    # shipped config.yaml it builds on.
    for name, path in zip(("config", "shipped config"), config_files(hydra_node), strict=False):
        extra[name] = read_source(str(path), "config")
    search = _search_folders(hydra_node) or None
    return _finish(groups, settings_raw, early, extra, parsed, choices, config_dirs, search)


def _search_folders(hydra: Any) -> list[Path]:
    """The config folders of Hydra's search path, in its order (where ``block/<name>.yaml`` is looked up,
    as ``model/`` is: shipped first, then ``-cd`` and ``hydra.searchpath`` folders)."""
    from omegaconf import OmegaConf

    found = OmegaConf.select(hydra, "runtime.config_sources", default=None) if hydra is not None else None
    return [Path(str(s.path)) for s in found or [] if s.get("schema") == "file" and s.get("path")]


def _plain_data(value: Any) -> Any:
    """Mappings of any kind as dicts, all the way down (the analysis reads plain dicts); the caller's
    data is not modified. Other values, tuples included, stay as they are."""
    if isinstance(value, Mapping):
        return {k: _plain_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_data(v) for v in value]
    return value


def resolve_mapping(
    mapping: Mapping[str, Any],
    task_overrides: Sequence[str] = (),
    file: str | None = None,
    config_dirs: Sequence[str] = (),
) -> ResolvedConfig:
    """Pass 2 for a model given from Python: a model mapping (what a model file holds), or a whole
    config holding one under ``model``. Only ``model.*``/``recipe.*``/``block.*`` overrides apply;
    ``config_dirs``: folders laid out like ``configs/``, where the model's blocks may be."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(mapping):
        mapping = OmegaConf.to_container(mapping, resolve=False)  # type: ignore[assignment]
    mapping = _plain_data(mapping)
    whole = isinstance(mapping.get("model"), Mapping)
    model = dict(mapping["model"]) if whole else dict(mapping)
    recipe = mapping.get("recipe") if whole else None
    settings_raw = {k: v for k, v in mapping.items() if k not in (*FILE_GROUPS, "hydra")} if whole else {}
    parsed = _parse(task_overrides)
    diags: list[Diagnostic] = []
    for o in parsed:
        if not overrides.held_back(o, FILE_GROUPS):
            message = f"override {o.input_line!r} needs a composed config: pass a model name or file"
            diags.append(error(o.key_or_group, "bad-override", message))
    groups = {
        "model": _Group(model, None, interpolate.find_sites(model), []),
        "recipe": _Group(
            dict(recipe) if isinstance(recipe, Mapping) else recipe, None, interpolate.find_sites(recipe), []
        ),
    }
    choices: dict[str, str | None] = {"model": file or "<mapping>", "recipe": None}
    return _finish(groups, settings_raw, diags, {}, parsed, choices, tuple(map(str, config_dirs)))


def resolve_source(source: Source, task_overrides: Sequence[str] = ()) -> ResolvedConfig:
    """Pass 2 for one parsed model file on its own: no Hydra composition, no recipe, default settings
    (tools and tests; commands compose)."""
    parsed = _parse(task_overrides)
    diags: list[Diagnostic] = []
    for o in parsed:
        if not overrides.held_back(o, ("model", "block")):
            message = (
                f"override {o.input_line!r} needs a composed config: pass a model name or file to load()"
            )
            diags.append(error(o.key_or_group, "bad-override", message))
    model = _Group(source.data, source, list(source.interpolations), list(source.diagnostics))
    groups = {"model": model, "recipe": _Group(None, None, [], [])}
    return _finish(groups, {}, diags, {}, parsed, {"model": source.file, "recipe": None}, ())


def resolve_file(path: str | Path, task_overrides: Sequence[str] = ()) -> ResolvedConfig:
    """``resolve_source`` of a model file (read once, see ``read_source``)."""
    return resolve_source(read_source(str(path), "model"), task_overrides)


def resolve_text(text: str, file: str = "<string>", task_overrides: Sequence[str] = ()) -> ResolvedConfig:
    """``resolve_source`` of model YAML given as text; diagnostics name ``file``."""
    from te_assembly.config.source import parse_text

    return resolve_source(parse_text(text, file, "model", "model"), task_overrides)


__all__ = [
    "ResolvedConfig",
    "read_source",
    "resolve_composed",
    "resolve_file",
    "resolve_mapping",
    "resolve_source",
    "resolve_text",
]
