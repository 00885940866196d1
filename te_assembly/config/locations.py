"""Where configs live: the shipped folders, a user's folders, and how a choice (``model=NAME`` or
``model=path/to/file.yaml``) becomes a file.

A *file group* is a config group whose options te_assembly reads itself (``model``, ``recipe``,
``block``): each option is one YAML file, ``<folder>/<group>/<name>.yaml`` in any config folder on the
search path, or the shipped recipes folder for ``recipe``. A model and a recipe are chosen
(``model=NAME``); blocks are used by a model's ``block:`` steps (``config/blocks.py``). Shipped configs
sit in the repository's ``configs/`` and ``recipes/`` (inside the package, ``_configs``/``_recipes``,
once installed from a wheel).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from te_assembly.diagnostics import Diagnostic, warning

FILE_GROUPS = ("model", "recipe", "block")
"""Config groups whose options are read by ``source.py``, never by Hydra (``composition.py``)."""

SUFFIXES = (".yaml", ".yml")

_PACKAGE_DIR = Path(__file__).resolve().parent.parent


def configs_dir() -> Path:
    """The shipped configs (``config.yaml``, ``model/``): in the package when installed, else the
    checkout's ``configs/``."""
    packaged = _PACKAGE_DIR / "_configs"
    return packaged if packaged.is_dir() else _PACKAGE_DIR.parent / "configs"


def recipes_dir() -> Path:
    """The shipped quantization recipes: ``_recipes`` in an installed wheel, else the repo's ``recipes/``."""
    packaged = _PACKAGE_DIR / "_recipes"
    return packaged if packaged.is_dir() else _PACKAGE_DIR.parent / "recipes"


def shipped_config(relative: str) -> Path:
    """A shipped config file by its path as a group option: ``model/residual_mlp.yaml``,
    ``recipe/mxfp8.yaml`` or ``config.yaml``. Works from any directory; raises ``FileNotFoundError``."""
    group, _, rest = relative.partition("/")
    path = recipes_dir() / rest if group == "recipe" and rest else configs_dir() / relative
    if not path.is_file():
        raise FileNotFoundError(f"no shipped config {relative!r} (looked for {path})")
    return path


def group_dir(root: Path, group: str) -> Path:
    """The folder of ``group``'s options in config folder ``root``."""
    if group == "recipe" and root.resolve() == configs_dir().resolve():
        return recipes_dir()
    return root / group


def is_path_choice(choice: str) -> bool:
    """``model=path/to/x.yaml`` names a file; ``model=moe_block`` names an option of the group."""
    return choice.endswith(SUFFIXES) or "/" in choice or "\\" in choice


def choice_stem(choice: object) -> str:
    """A group choice as a file or folder name: ``moe_block`` as it is, ``path/to/my_block.yaml`` as
    ``my_block``, any character a path could trip on as ``_``; ``none`` for no choice (``model=null``).
    Run directories (``outputs/<model>/...``) and ``graph``'s files are named with it."""
    if choice is None or str(choice).strip() == "":
        return "none"
    text = str(choice)
    if is_path_choice(text):
        name = re.split(r"[\\/]", text.rstrip("/\\"))[-1]
        text = (
            name[: -len(suffix)] if (suffix := next((s for s in SUFFIXES if name.endswith(s)), "")) else name
        )
    cleaned = re.sub(r"[^A-Za-z0-9_.+-]", "_", text).strip(".")
    return cleaned or "model"


def find_option(group: str, choice: str, roots: Iterable[Path]) -> Path | None:
    """The file option ``choice`` of ``group`` stands for: the first config folder that has it, in
    search-path order; or, for a path choice, that file (relative to the working directory)."""
    if is_path_choice(choice):
        path = Path(choice).expanduser()
        return path.resolve() if path.is_file() else None
    files = option_files(group, choice, roots)
    return files[0] if files else None


def option_files(group: str, choice: str, roots: Iterable[Path]) -> list[Path]:
    """Every file named ``choice`` in ``group`` across these config folders, in search-path order (the
    first is the one used)."""
    found: list[Path] = []
    for root in roots:
        folder = group_dir(root, group)
        found.extend(folder / f"{choice}{s}" for s in SUFFIXES if (folder / f"{choice}{s}").is_file())
    return found


def shadowed(group: str, choice: str, roots: Iterable[Path], path: str) -> Diagnostic | None:
    """A warning when an option name exists in more than one config folder: only the first is read,
    and a user who copied a shipped config to edit it must not lose the edits silently."""
    if is_path_choice(choice):
        return None
    files = option_files(group, choice, roots)
    if len(files) < 2:
        return None
    ignored = ", ".join(str(f) for f in files[1:])
    return warning(
        path,
        "shadowed-config",
        f"{group} {choice!r} is in more than one config folder: using {files[0]}, not {ignored}",
        f"give yours another name (and `name:`), or choose it by path: {group}={files[1]}",
    )


def list_options(group: str, roots: Iterable[Path]) -> list[str]:
    """Every option name of ``group`` in these config folders."""
    names: set[str] = set()
    for root in roots:
        folder = group_dir(root, group)
        if folder.is_dir():
            names.update(p.stem for p in folder.iterdir() if p.suffix in SUFFIXES and p.is_file())
    return sorted(names)


def shipped_roots() -> list[Path]:
    return [configs_dir()]


def available_models(config_dirs: Sequence[str | Path] = ()) -> list[str]:
    """Model names: shipped, then in ``config_dirs`` (folders holding ``model/*.yaml``)."""
    return list_options("model", [*shipped_roots(), *map(Path, config_dirs)])


def available_recipes(config_dirs: Sequence[str | Path] = ()) -> list[str]:
    return list_options("recipe", [*shipped_roots(), *map(Path, config_dirs)])


def available_blocks(config_dirs: Sequence[str | Path] = ()) -> list[str]:
    """Block names: shipped (``configs/block/``), then in ``config_dirs`` (folders holding ``block/``)."""
    return list_options("block", [*shipped_roots(), *map(Path, config_dirs)])


__all__ = [
    "FILE_GROUPS",
    "available_blocks",
    "available_models",
    "available_recipes",
    "choice_stem",
    "configs_dir",
    "find_option",
    "group_dir",
    "is_path_choice",
    "list_options",
    "recipes_dir",
    "shipped_config",
]
