"""Hydra composition, with the model and the recipe kept out of OmegaConf.

Hydra composes ``configs/config.yaml`` as usual: its defaults list picks ``model: moe_block`` and
``recipe: bf16``; overrides, ``--config-dir``, ``hydra.searchpath``, sweeps, ``--cfg`` and ``--info``
behave as in any Hydra app. One thing differs, and it is why a 10,000-step model validates in a second
rather than a minute: an option of a *file group* (``locations.FILE_GROUPS``: ``model``, ``recipe``) is
never parsed by Hydra.

* ``GroupRepository`` answers Hydra's lookup of ``model/<choice>`` by finding the file along Hydra's own
  search path (shipped configs first, then ``--config-dir`` and ``hydra.searchpath`` folders: Hydra's
  order), or the file itself for ``model=path/to/file.yaml``, and hands Hydra a stub
  ``{_group_: model, _choice_: <choice>, _source_: <file>}``. So any folder on the search path may hold
  models and recipes, and none of them is loaded node by node.
* ``GroupConfigLoader`` keeps value overrides below a file group (``model.dims.hidden=128``,
  ``~model.ops.3``) out of Hydra's own application (the stub has no such keys) but in
  ``hydra.overrides.task``: sweeps expand them like any override, and each job reads its own.

``resolved.py`` then reads the stub's file once (``source.py``), merges anything other configs put under
the group, applies the held-back overrides (``overrides.py``) and resolves interpolations. This relies on
Hydra 1.3's ``ConfigRepository`` and ``ConfigLoaderImpl`` (pinned in pyproject).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
from hydra._internal.config_repository import ConfigRepository
from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_config_search_path
from hydra.core.config_search_path import SearchPathQuery
from hydra.core.global_hydra import GlobalHydra
from hydra.core.object_type import ObjectType
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.plugins.config_source import ConfigResult
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from te_assembly.config.interpolate import register_resolvers
from te_assembly.config.locations import (
    FILE_GROUPS,
    configs_dir,
    is_path_choice,
    kept_inside,
    recipes_dir,
    shipped_config,
)
from te_assembly.config.no_code import (
    LOGGING,
    code_in_config,
    drop_file_handlers,
    refused_env_copy,
    refused_searchpath,
)
from te_assembly.config.overrides import held_back
from te_assembly.errors import ConfigError

STUB_KEYS = ("_group_", "_choice_", "_source_")
"""Keys of the node Hydra composes for a file-group option; anything else under the group was merged
in by another config."""

CONFIG_NAME = "config"


def _split(config_path: str) -> tuple[str | None, str]:
    group, sep, choice = config_path.partition("/")
    if sep and group in FILE_GROUPS and choice:
        return group, choice
    return None, config_path


class GroupRepository(ConfigRepository):
    """Hydra's config repository, except that file-group options come back as stubs (module docstring)."""

    def locate(self, group: str, choice: str) -> str | None:
        """Where option ``choice`` of ``group`` lives: a file path or ``pkg://module/file``; None if
        nowhere. The first source on the search path that has it wins, as in Hydra."""
        if is_path_choice(choice):
            path = Path(choice).expanduser()
            return str(path.resolve()) if path.is_file() else None
        for source in self.sources:
            scheme = source.scheme()
            for suffix in (".yaml", ".yml"):
                relative = f"{group}/{choice}{suffix}"
                if scheme == "file":
                    root = Path(source.path)
                    folder = recipes_dir() if _is_shipped(root) and group == "recipe" else root / group
                    candidate = folder / f"{choice}{suffix}"
                    if candidate.exists() or candidate.is_symlink():
                        return str(kept_inside(candidate, folder, group))
                elif scheme == "pkg" and source.is_config(relative):
                    return f"pkg://{source.path}/{relative}"
                elif scheme == "structured" and source.is_config(relative):
                    return "structured://"
        return None

    def load_config(self, config_path: str) -> ConfigResult | None:
        group, choice = _split(config_path)
        if group is None:
            return super().load_config(config_path)
        location = self.locate(group, choice)
        if location is None:
            return None
        if location == "structured://":  # a model registered from Python: Hydra's own node
            return super().load_config(config_path)
        stub = OmegaConf.create({"_group_": group, "_choice_": choice, "_source_": location})
        result = ConfigResult(
            provider="te_assembly", path=f"te_assembly://{group}", config=stub, header={"package": None}
        )
        result.defaults_list = []
        return result

    def config_exists(self, config_path: str) -> bool:
        group, choice = _split(config_path)
        if group is None:
            return super().config_exists(config_path)
        return self.locate(group, choice) is not None

    def group_exists(self, config_path: str) -> bool:
        return config_path in FILE_GROUPS or super().group_exists(config_path)

    def get_group_options(
        self, group_name: str, results_filter: ObjectType | None = ObjectType.CONFIG
    ) -> list[str]:
        options = set(super().get_group_options(group_name, results_filter))
        if group_name == "recipe" and results_filter in (ObjectType.CONFIG, None):
            options.update(p.stem for p in recipes_dir().glob("*.yaml"))
        if group_name == "" and results_filter in (ObjectType.GROUP, None):
            options.update(FILE_GROUPS)
        return sorted(options)


def _is_shipped(root: Path) -> bool:
    try:
        return root.resolve() == configs_dir().resolve()
    except OSError:
        return False


class GroupConfigLoader(ConfigLoaderImpl):
    """Hydra's config loader with ``GroupRepository``, holding back file-group value overrides."""

    def __init__(self, config_search_path: Any, writes_files: bool = True) -> None:
        super().__init__(config_search_path=config_search_path)
        self.repository = GroupRepository(config_search_path=config_search_path)
        self.writes_files = writes_files
        """False for a command that writes nothing: Hydra's log file (``hydra/job_logging=default``)
        is dropped, since its run directory is the folder the command runs in."""

    def _process_config_searchpath(self, config_name: str | None, parsed_overrides: Any, repo: Any) -> None:
        """Hydra's, after refusing a ``pkg://`` search path (``no_code.refused_searchpath``): Hydra
        imports such a package as soon as it adds it to the search path, before composing anything."""
        entries = next(
            (o.value() for o in parsed_overrides if o.get_key_element() == "hydra.searchpath"), None
        )
        if entries is None and config_name is not None:
            loaded = repo.load_config(config_path=config_name)
            if loaded is not None and OmegaConf.is_dict(loaded.config):
                entries = OmegaConf.select(loaded.config, "hydra.searchpath")
        refused = refused_searchpath(entries)
        if refused:
            raise ConfigError(refused)
        super()._process_config_searchpath(config_name, parsed_overrides, repo)

    def load_configuration(
        self,
        config_name: str | None,
        overrides: list[str],
        run_mode: RunMode,
        from_shell: bool = True,
        validate_sweep_overrides: bool = True,
    ) -> DictConfig:
        parser = OverridesParser.create()
        parsed = parser.parse_overrides(overrides=[_null_choice(o) for o in overrides])
        held = [o for o in parsed if held_back(o, FILE_GROUPS)]
        if held and validate_sweep_overrides:
            self.validate_sweep_overrides_legal(overrides=held, run_mode=run_mode, from_shell=from_shell)
        passed = [str(o.input_line) for o in parsed if not held_back(o, FILE_GROUPS)]
        try:
            cfg = super().load_configuration(
                config_name=config_name,
                overrides=passed,
                run_mode=run_mode,
                from_shell=from_shell,
                validate_sweep_overrides=validate_sweep_overrides,
            )
        except KeyError as exc:
            refusal = _env_copy_refusal(exc)
            if not isinstance(refusal, ConfigError):
                raise
            # Everything else the config asks for is refused with it: composed again without the copy.
            rest = super().load_configuration(
                config_name=config_name,
                overrides=[*passed, "hydra.job.env_copy=[]"],
                run_mode=run_mode,
                from_shell=from_shell,
                validate_sweep_overrides=validate_sweep_overrides,
            )
            others = code_in_config(OmegaConf.to_container(rest, resolve=False), jobs=config_name is not None)  # type: ignore[arg-type]
            raise ConfigError([*others, *refusal.diagnostics]) from None
        # Without a primary config (--hydra-help) no command runs: Hydra's default output_subdir stands.
        container = OmegaConf.to_container(cfg, resolve=False)
        resolved = resolved_where_possible(cfg.hydra) if "hydra" in cfg else None
        refused = code_in_config(container, jobs=config_name is not None, resolved_hydra=resolved)  # type: ignore[arg-type]
        if refused:  # before Hydra builds a callback, a logging handler or a launcher from it
            raise ConfigError(refused)
        if not self.writes_files:
            with open_dict(cfg.hydra):
                for section in LOGGING:
                    drop_file_handlers(OmegaConf.select(cfg, section))
        if held:
            app = [o for o in parsed if not o.is_hydra_override()]
            with open_dict(cfg.hydra):
                cfg.hydra.overrides.task = [o.input_line for o in app]
                job = cfg.hydra.job
                job.override_dirname = get_overrides_dirname(
                    overrides=app,
                    kv_sep=job.config.override_dirname.kv_sep,
                    item_sep=job.config.override_dirname.item_sep,
                    exclude_keys=job.config.override_dirname.exclude_keys,
                )
        return cfg


def resolved_where_possible(node: Any) -> Any:
    """``node`` as plain data, every interpolation that can be resolved now resolved and every other one
    kept as its text (``hydra.runtime.*`` is filled in when the job starts). Resolving builds config
    nodes only: nothing is instantiated."""
    raw: Any = OmegaConf.to_container(node, resolve=False)
    keys: Any = raw.keys() if isinstance(raw, dict) else range(len(raw)) if isinstance(raw, list) else ()
    out: Any = {} if isinstance(raw, dict) else [] if isinstance(raw, list) else raw
    for key in keys:
        try:
            value = node[key]
        except Exception:  # an interpolation that cannot be resolved yet, a missing value (???)
            value = raw[key]
        if OmegaConf.is_config(value):
            value = resolved_where_possible(value)
        if isinstance(out, dict):
            out[key] = value
        else:
            out.append(value)
    return out


def _env_copy_refusal(exc: KeyError) -> Exception:
    """Hydra copies ``hydra.job.env_copy``'s variables while it composes, before te_assembly sees the
    config: a variable that is not set fails there, as a bare KeyError. That one is the config's
    ``env_copy`` refused (``no_code``); any other KeyError is re-raised as it is."""
    frames, tb = [], exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    name = exc.args[0] if exc.args else None
    from_env_copy = frames[-2:-1] == ["_load_configuration_impl"] or frames[-1:] == [
        "_load_configuration_impl"
    ]
    if not from_env_copy or not isinstance(name, str) or name in os.environ:
        return exc
    return ConfigError(refused_env_copy([name]))


def _null_choice(override: str) -> str:
    """``recipe=null`` means no recipe: Hydra 1.3 spells that ``~recipe`` (it refuses a null choice)."""
    key, sep, value = override.partition("=")
    if sep and key in FILE_GROUPS and value.strip() == "null":
        return f"~{key}"
    return override


def search_path(config_dirs: Sequence[str | os.PathLike[str]] = (), config_path: str | None = None) -> Any:
    """Hydra's search path for te_assembly: Hydra's own configs, the primary config folder (the shipped
    ``configs/``, or ``--config-path``), each ``--config-dir`` folder, then Hydra's schema source. With
    ``--config-path`` the shipped folder follows it, so shipped models stay available."""
    main = Path(config_path).resolve() if config_path else configs_dir()
    path = create_config_search_path(f"file://{main}")
    for folder in config_dirs:
        path.prepend(
            "command-line", f"file://{Path(folder).resolve()}", anchor=SearchPathQuery(provider="schema")
        )
    if config_path:
        path.prepend("te_assembly", f"file://{configs_dir()}", anchor=SearchPathQuery(provider="schema"))
    return path


def create_hydra(
    task_name: str,
    config_dirs: Sequence[str | os.PathLike[str]] = (),
    config_path: str | None = None,
    writes_files: bool = True,
) -> Hydra:
    """A ``Hydra`` instance with ``GroupConfigLoader``, installed as the global one (clear it with
    ``GlobalHydra.instance().clear()`` when done). ``writes_files=False``: a command that writes nothing,
    so no log file either."""
    from hydra import version

    for folder in config_dirs:
        if not Path(folder).is_dir():
            from hydra.errors import SearchPathException

            raise SearchPathException(f"Additional config directory '{Path(folder).resolve()}' not found")
    register_resolvers()
    version.setbase("1.3")
    GlobalHydra.instance().clear()
    loader = GroupConfigLoader(search_path(config_dirs, config_path), writes_files)
    hydra = Hydra(task_name=task_name, config_loader=loader)
    GlobalHydra.instance().initialize(hydra)
    return hydra


def compose(overrides: Sequence[str] = (), config_dirs: Sequence[str | os.PathLike[str]] = ()) -> DictConfig:
    """The composed config (file groups as stubs) for the Python API; raises Hydra's exceptions."""
    hydra = create_hydra("te_assembly", config_dirs)
    try:
        return hydra.compose_config(
            CONFIG_NAME, list(overrides), run_mode=RunMode.RUN, with_log_configuration=False
        )
    finally:
        GlobalHydra.instance().clear()


def config_files(hydra: Any) -> list[Path]:
    """The file Hydra read the primary config from (the first folder of the search path that has it;
    ``hydra``: Hydra's node of the composed config), then the shipped ``config.yaml`` if that is another."""
    name = OmegaConf.select(hydra, "job.config_name") if hydra is not None else None
    files: list[Path] = []
    for source in (OmegaConf.select(hydra, "runtime.config_sources") if hydra is not None else None) or []:
        if source.get("schema") == "file":
            candidate = Path(source.path) / f"{name or CONFIG_NAME}.yaml"
            if candidate.is_file():
                files.append(candidate)
                break
    shipped = shipped_config(f"{CONFIG_NAME}.yaml")
    if shipped not in files:
        files.append(shipped)
    return files


__all__ = [
    "CONFIG_NAME",
    "STUB_KEYS",
    "GroupConfigLoader",
    "GroupRepository",
    "compose",
    "config_files",
    "create_hydra",
    "search_path",
]
