"""Pass 2 of the config pipeline: plain, resolved data for the model, the recipe and every settings
section, with the problems found while getting there.

From a Hydra composition (``composition.py``: file groups arrive as stubs), each file-group option is read
once (``source.py``), anything other configs merged under it is merged in, its held-back overrides are
applied (``overrides.py``) and its interpolations resolved (``interpolate.py``). Settings sections are
small and come from Hydra's own composition, resolved leaf by leaf. From Python, a mapping takes the
model file's place. Nothing here checks what the values mean: that is the analysis (``validate/``).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from te_assembly.config import interpolate, overrides
from te_assembly.config.locations import FILE_GROUPS
from te_assembly.config.source import Key, Source, read_bytes, read_file
from te_assembly.diagnostics import Diagnostic, error

log = logging.getLogger(__name__)

PREFIXES = {"model": "model", "recipe": "recipe"}


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

    def file_of(self, group: str) -> str | None:
        source = self.sources.get(group)
        return source.file if source is not None else None

    def as_config(self) -> dict[str, Any]:
        """The whole config as the commands read it: the model and the recipe as read (overrides and
        interpolations applied), then every settings section, resolved. A run directory's
        ``config.yaml`` holds it, and ``te_assembly.load()`` takes it back as a mapping."""
        return {"model": self.model, "recipe": self.recipe, **self.settings}


# ------------------------------------------------------------------------------------------- reading

_CACHE: OrderedDict[tuple[Any, ...], Source] = OrderedDict()
_CACHE_SIZE = 4
"""Parsed files kept (a 10,000-step model's source is about 50 MiB with its line map)."""


def read_source(location: str, kind: str) -> Source:
    """The parsed file at ``location`` (a path, or ``pkg://module/file``). A file unchanged since it
    was last read in this process (same size, modification time and inode) is not parsed again:
    a sweep over one model parses it once."""
    prefix = PREFIXES.get(kind, "")
    if location.startswith("pkg://"):
        module, _, relative = location.removeprefix("pkg://").partition("/")
        return read_bytes(resources.files(module).joinpath(relative).read_bytes(), location, kind, prefix)
    try:
        stat = Path(location).stat()
        key: tuple[Any, ...] | None = (location, kind, stat.st_size, stat.st_mtime_ns, stat.st_ino)
    except OSError:
        key = None
    if key is not None and key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    start = time.perf_counter()
    source = read_file(location, kind, prefix)
    log.debug("read %s (%s) in %.3f s", location, kind, time.perf_counter() - start)
    if key is not None and source.ok:
        _CACHE[key] = source
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return source


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
        g.diagnostics.append(g.source.locate(error(group, "empty-file", f"the {group} file is empty")))
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
) -> ResolvedConfig:
    """Overrides, then every interpolation of the model, the recipe and the settings, in one pass: each
    section is a root of the same ``Interpolator``, so ``bench.tokens: ${mul:4,${model.dims.hidden}}``
    and ``${seed}`` in a model resolve alike."""
    for name, g in groups.items():
        _shape_check(name, g)
        _apply_overrides(name, g, parsed_overrides)
    roots = {**settings_raw, **{name: g.data for name, g in groups.items() if g.data is not None}}
    resolver = interpolate.Interpolator(roots)
    data: dict[str, Any] = {}
    diags: list[Diagnostic] = list(early)
    for name, g in groups.items():
        diags.extend(g.diagnostics)
        if g.data is None:
            data[name] = None
            continue
        value, found = interpolate.resolve_sites(resolver, name, sorted(set(g.sites), key=_site_key), name)
        data[name] = value
        diags.extend(found)
    settings: dict[str, Any] = {}
    for key, raw in settings_raw.items():
        value, found = interpolate.resolve_sites(resolver, key, interpolate.find_sites(raw), key)
        diags.extend(found)
        if value is not interpolate.DROPPED:
            settings[key] = value
    sources = {name: g.source for name, g in groups.items() if g.source is not None}
    sources.update(extra_sources)
    located = [_locate(d, sources) for d in diags]
    return ResolvedConfig(
        model=data.get("model"),
        recipe=data.get("recipe"),
        settings=settings,
        sources=sources,
        diagnostics=tuple(located),
        overrides=tuple(o.input_line for o in parsed_overrides),
        choices=choices,
        config_dirs=tuple(config_dirs),
    )


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
        for name in FILE_GROUPS
    }
    choices = {
        name: OmegaConf.select(hydra_node, f"runtime.choices.{name}", default=None) for name in FILE_GROUPS
    }
    unresolved = OmegaConf.to_container(cfg, resolve=False)  # reading cfg[k] would resolve interpolations
    assert isinstance(unresolved, dict)
    settings_raw = {str(k): v for k, v in unresolved.items() if k not in FILE_GROUPS and k != "hydra"}
    extra: dict[str, Source] = {}
    # Settings are located in the primary config first (a user's ``-cn experiment``), then in the
    # shipped config.yaml it builds on.
    for name, path in zip(("config", "shipped config"), config_files(hydra_node), strict=False):
        extra[name] = read_source(str(path), "config")
    return _finish(groups, settings_raw, [], extra, parsed, choices, config_dirs)


def _plain_data(value: Any) -> Any:
    """Mappings of any kind as dicts, all the way down (the analysis reads plain dicts); the caller's
    data is not modified. Other values, tuples included, stay as they are."""
    if isinstance(value, Mapping):
        return {k: _plain_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_data(v) for v in value]
    return value


def resolve_mapping(
    mapping: Mapping[str, Any], task_overrides: Sequence[str] = (), file: str | None = None
) -> ResolvedConfig:
    """Pass 2 for a model given from Python: a model mapping (what a model file holds), or a whole
    config holding one under ``model``. Only ``model.*``/``recipe.*`` overrides apply."""
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
    return _finish(groups, settings_raw, diags, {}, parsed, choices, ())


def resolve_source(source: Source, task_overrides: Sequence[str] = ()) -> ResolvedConfig:
    """Pass 2 for one parsed model file on its own: no Hydra composition, no recipe, default settings
    (tools and tests; commands compose)."""
    parsed = _parse(task_overrides)
    diags: list[Diagnostic] = []
    for o in parsed:
        if not overrides.held_back(o, ("model",)):
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
