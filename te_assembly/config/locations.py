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

from te_assembly.diagnostics import Diagnostic, error, warning
from te_assembly.files.file_types import not_regular
from te_assembly.files.names import as_file_name, inside

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
    return as_file_name(text, "model")


def run_dir_name(choice: object, *sources: object) -> str:
    """The folder a command's runs go under (``outputs/<this>/<date>_<time>``): the model choice's
    ``choice_stem``, or the folder name of the first source given (``verify hf=DIR``'s checkpoint,
    ``eval SOURCE``'s model: their model is the source, not the default model choice)."""
    for source in sources:
        if source is not None and str(source).strip():
            path = Path(str(source)).expanduser()
            return as_file_name(path.name or path.resolve().name, "source")
    return choice_stem(choice)


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
    first is the one used); each checked by ``kept_inside``."""
    found: list[Path] = []
    for root in roots:
        folder = group_dir(root, group)
        for suffix in SUFFIXES:
            candidate = folder / f"{choice}{suffix}"
            if candidate.exists() or candidate.is_symlink():
                found.append(kept_inside(candidate, folder, group))
    return found


def kept_inside(candidate: Path, root: Path, group: str) -> Path:
    """``candidate``, a file found by name in the config folder ``root``; ``ConfigError`` when it is no
    regular file (a FIFO, a device: never opened) or a symlink out of that folder (the shared reader's
    rule: a file found in a folder stays in it; a file named by its own path, ``model=path.yaml``, may
    be anywhere)."""
    from te_assembly.errors import ConfigError

    kind = not_regular(candidate) if candidate.exists() else "a broken symlink"
    if kind is not None:
        message = f"{candidate} is {kind}, not a {group} file: refusing to read it"
        raise ConfigError([error(group, "no-such-file", message).located(str(candidate), None)])
    if inside(candidate, root):
        return candidate
    message = (
        f"{candidate} leads to {candidate.resolve()}, outside its config folder {root}: refusing to read it"
    )
    hint = f"copy the file into {root}, or name it by its path: {group}={candidate.resolve()}"
    raise ConfigError([error(group, "outside-folder", message, hint).located(str(candidate), None)])


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
