"""The pytest plugin (entry point ``pytest11``): every model, block and recipe of a config folder as a
test item. Inert unless asked for: ``pytest --te-configs DIR [DIR ...]``, or the ini option
``te_configs`` (``[tool.pytest.ini_options]`` in ``pyproject.toml``), which applies when pytest runs on
its configured test paths.

A folder is laid out like ``configs/``: ``model/*.yaml``, ``block/*.yaml``, ``recipe/*.yaml``; a file's
``NAME.expect.yaml`` sidecar (``expect.py``) declares the diagnostics it must report and its override
sets. Items:

- ``model/M.yaml::validate[...]``: M validates under each override set (or reports exactly what its
  sidecar expects); ``te_configs_recipes`` adds ``validate[recipe=R]`` per listed recipe.
- ``block/B.yaml::validate[...]``: B validates inside the smallest model that uses it.
- ``recipe/R.yaml::validate`` and ``with[M]``: R is a valid recipe, and each valid model of the folder
  validates with it (its shape rules).
- opt-in, each with its marker (``--te-configs-level build smoke te``): ``build`` (the reference
  engine's model on torch's meta device), ``smoke`` (one forward+backward on CPU), ``te`` (through TE's
  fusers; skipped with the reason when TE does not import); ``--te-configs-target h100``: ``fits[h100]``.

A failure shows te_assembly's diagnostics (key path, file:line, hint), not a traceback. Importing this
module imports neither torch nor Hydra: pytest loads it in every session.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

KINDS = ("model", "block", "recipe")
LEVELS = ("build", "smoke", "te")
AS_WRITTEN = "-"
"""An ``te_configs_overrides`` line that stands for the config as written (no overrides)."""

_DIRS = pytest.StashKey[list[Path]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("te_assembly", "te_assembly config checks")
    group.addoption(
        "--te-configs",
        nargs="+",
        metavar="DIR",
        default=None,
        help="check every model, block and recipe under these config folders (laid out like configs/)",
    )
    group.addoption(
        "--te-configs-level",
        nargs="+",
        choices=LEVELS,
        default=None,
        help="deeper checks of each valid model: build (meta device), smoke (CPU step), te (TE's fusers)",
    )
    group.addoption(
        "--te-configs-target",
        default=None,
        metavar="NAME",
        help="check that each valid model trains on one NAME accelerator per rank (a100, h100, h200...)",
    )
    parser.addini("te_configs", type="paths", help="config folders to check (as --te-configs)")
    parser.addini(
        "te_configs_overrides",
        type="linelist",
        help="override sets, one per line, each a test of every model ('-': as written)",
    )
    parser.addini("te_configs_recipes", type="args", help="recipes every model is also checked with")
    parser.addini("te_configs_levels", type="args", help="deeper levels (as --te-configs-level)")
    parser.addini("te_configs_target", type="string", default="", help="as --te-configs-target")


def pytest_configure(config: pytest.Config) -> None:
    for level in LEVELS:
        config.addinivalue_line("markers", f"{level}: te_assembly config check at the '{level}' level")
    config.addinivalue_line("markers", "te_config: a te_assembly config check (te_assembly.testing)")
    given = config.getoption("te_configs")
    folders = [Path(d) for d in given] if given else []
    from_ini = [Path(p) for p in config.getini("te_configs")]
    # The ini's folders join a run on the configured test paths, not one on paths named by hand.
    on_testpaths = config.args_source != pytest.Config.ArgsSource.ARGS
    chosen = folders or (from_ini if on_testpaths else [])
    watched = [p.resolve() for p in [*folders, *from_ini]]
    config.stash[_DIRS] = watched
    for folder in chosen:
        if not folder.is_dir():
            raise pytest.UsageError(f"te_configs: {folder} is not a directory")
        if str(folder) not in config.args and not any(
            folder.resolve().is_relative_to(Path(a).resolve()) for a in config.args
        ):
            config.args.append(str(folder))


def _folder_of(config: pytest.Config, path: Path) -> Path | None:
    parent = path.parent.parent.resolve()
    return parent if parent in config.stash.get(_DIRS, []) else None


def _watched_folder(config: pytest.Config, path: Path) -> Path | None:
    """The config folder ``path`` is in (by its parent, resolved: ``path`` itself may be a link)."""
    try:
        parent = path.parent.resolve()
    except (OSError, RuntimeError):
        return None
    return next((f for f in config.stash.get(_DIRS, []) if parent == f or f in parent.parents), None)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Inside a config folder, the bounded reader's rule for folders: a symlinked folder is not walked
    (a link to a folder above it would make the walk endless)."""
    if collection_path.is_symlink() and _watched_folder(config, collection_path) is not None:
        if collection_path.is_dir() or not collection_path.exists():
            return True
    return None


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.suffix != ".yaml" or file_path.name.endswith(".expect.yaml"):
        return None
    if file_path.parent.name not in KINDS or _folder_of(parent.config, file_path) is None:
        return None
    return ConfigFile.from_parent(parent, path=file_path)


def _sets(config: pytest.Config, own: Sequence[Sequence[str]] | None) -> list[tuple[str, ...]]:
    if own is not None:
        return [tuple(s) for s in own]
    lines = config.getini("te_configs_overrides")
    if not lines:
        return [()]
    return [() if line.strip() == AS_WRITTEN else tuple(line.split()) for line in lines]


def _label(overrides: Sequence[str]) -> str:
    return " ".join(overrides) or "as written"


class ConfigFile(pytest.File):
    """One config file of a folder; its items are its checks."""

    def collect(self) -> Iterator[pytest.Item]:
        from te_assembly.errors import ConfigCheckError, SidecarError
        from te_assembly.files.read import check_within
        from te_assembly.testing.expect import read_sidecar

        folder = _folder_of(self.config, self.path)
        assert folder is not None
        kind = self.path.parent.name

        def outside(path: str, problem: str, code: str, line: int | None) -> Exception:
            return ConfigCheckError(f"{path}: {problem}")

        try:  # a file found in the folder: a symlink may not lead out of it (the bounded reader's rule)
            check_within(self.path, folder, outside)
        except ConfigCheckError as exc:
            yield ConfigItem.from_parent(self, name="read", check=("refused", str(exc)))
            return
        try:
            sidecar = read_sidecar(self.path)
        except SidecarError as exc:
            yield ConfigItem.from_parent(self, name="sidecar", check=("sidecar", str(exc)))
            return
        # The ini's override sets are every model's; a block's come from its own sidecar.
        sets = _sets(self.config, sidecar.overrides) if kind == "model" else [*(sidecar.overrides or [()])]
        if kind == "recipe":
            yield from self._recipe_items(folder, sidecar)
            return
        named = len(sets) > 1 or sets != [()]
        for overrides in sets:
            name = f"validate[{_label(overrides)}]" if named else "validate"
            yield ConfigItem.from_parent(self, name=name, check=(kind, folder, sidecar, overrides))
        if kind != "model":
            return
        for recipe in self.config.getini("te_configs_recipes"):
            extra = (f"recipe={recipe}",)
            yield ConfigItem.from_parent(
                self, name=f"validate[{_label(extra)}]", check=(kind, folder, sidecar, extra)
            )
        if sidecar.expects_errors:
            return  # an invalid model has nothing to build
        levels = self.config.getoption("te_configs_level") or self.config.getini("te_configs_levels")
        for level in LEVELS:
            if level in levels:
                item = ConfigItem.from_parent(self, name=level, check=(level, folder))
                item.add_marker(getattr(pytest.mark, level))
                yield item
        target = self.config.getoption("te_configs_target") or self.config.getini("te_configs_target")
        if target:
            yield ConfigItem.from_parent(self, name=f"fits[{target}]", check=("fits", folder, target))

    def _recipe_items(self, folder: Path, sidecar: Any) -> Iterator[pytest.Item]:
        from te_assembly.errors import SidecarError
        from te_assembly.testing.expect import read_sidecar

        yield ConfigItem.from_parent(self, name="validate", check=("recipe", folder, sidecar, ()))
        if sidecar.expects_errors:
            return
        for model in sorted((folder / "model").glob("*.yaml")):
            if model.name.endswith(".expect.yaml"):
                continue
            try:
                if read_sidecar(model).expects_errors:
                    continue
            except SidecarError:
                continue
            name = model.name.removesuffix(".yaml")
            yield ConfigItem.from_parent(self, name=f"with[{name}]", check=("with", folder, model))


class ConfigItem(pytest.Item):
    def __init__(self, *, check: tuple[Any, ...], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.check = check
        self.add_marker(pytest.mark.te_config)

    def runtest(self) -> None:
        from te_assembly.testing import runner

        runner.run_check(self.path, self.check)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        from te_assembly.errors import ConfigCheckError, SidecarError, TeAssemblyError

        if isinstance(excinfo.value, (ConfigCheckError, SidecarError, TeAssemblyError)):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"{self.path.parent.name} {self.path.name}::{self.name}"
