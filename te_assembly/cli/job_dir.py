"""Where a command's files go: this job's run directory, Hydra's ``hydra.run.dir`` (``hydra.sweep.dir``
and ``subdir`` with ``-m``), by default ``outputs/<model>/<date>_<time>``.

``train``, ``bench``, ``graph`` and ``verify`` write there (``RUN_DIR = True`` in their module), each
with the fully resolved config beside its results (``config.yaml``); the other commands write nothing
there, and the app keeps Hydra from making a folder for them (``app.py``).

Hydra makes the folder before the job starts. Two jobs of the same model started in the same second
get the same default name, so a job *claims* its folder by creating ``config.yaml`` exclusively; the
second finds it taken and uses ``<name>_1`` (then ``_2``...). A folder named on the command line
(``hydra.run.dir=...``) is used as it is. A job that ends without writing anything leaves no folder
behind (``remove_if_unused``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from te_assembly.files.ownership import check_not_a_run, check_not_theirs, config_text
from te_assembly.files.write import write_text_atomic

CONFIG_FILE = "config.yaml"
_DIR_KEYS = ("hydra.run.dir", "hydra.sweep.dir", "hydra.sweep.subdir")


@dataclass(frozen=True)
class JobDir:
    path: Path
    """Hydra's output directory of this job (absolute), already made by Hydra."""
    default: bool
    """The config's pattern, not a directory named on the command line."""
    runs_root: Path | None
    """Where this model's runs are kept: the parent of ``hydra.run.dir`` (``train.resume=true`` looks
    for the run to continue there). None when the directory was named on the command line."""
    model: str
    """The model choice as a file name (``config.locations.choice_stem``)."""
    command: str
    overrides: tuple[str, ...]


def _sets(overrides: Any, keys: tuple[str, ...]) -> bool:
    return any(str(o).lstrip("+~").split("=", 1)[0] in keys for o in overrides or ())


def current(command: str) -> JobDir:
    """This job's directory, from Hydra's config of the running job."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from te_assembly.config.locations import choice_stem

    hydra: Any = HydraConfig.get()
    path = Path(str(hydra.runtime.output_dir)).resolve()
    named = _sets(OmegaConf.to_container(hydra.overrides.hydra, resolve=False), _DIR_KEYS)
    runs_root = None
    if not named:
        with contextlib.suppress(Exception):  # resolving the pattern again only needs Hydra's own nodes
            runs_root = Path(str(OmegaConf.select(hydra, "run.dir"))).resolve().parent
    choice = OmegaConf.select(hydra, "runtime.choices.model", default=None)
    task = OmegaConf.to_container(hydra.overrides.task, resolve=False)
    overrides = tuple(str(o) for o in task) if isinstance(task, list) else ()
    return JobDir(path, not named, runs_root, choice_stem(choice), command, overrides)


def check_claimable(job: JobDir) -> None:
    """``OutputPathError`` when a run directory named by hand (``hydra.run.dir``) is another run's, or
    holds a ``config.yaml`` te_assembly did not write: checked before a command starts its work."""
    if not job.default:
        check_not_a_run(job.path, f"{job.command}'s run directory")
        check_not_theirs(job.path / CONFIG_FILE, job.command)


def claim(job: JobDir) -> Path:
    """The directory this job writes to, made if needed: Hydra's, or for a default name another job
    already holds (same model, same second), the first free ``<name>_<n>``. Claimed by creating an
    empty ``config.yaml`` exclusively (``write_config`` fills it)."""
    if not job.default:
        check_claimable(job)
        job.path.mkdir(parents=True, exist_ok=True)
        return job.path
    return _first_free(job.path, CONFIG_FILE)


def _first_free(path: Path, marker: str) -> Path:
    """``path``, or the first ``<path>_<n>`` whose ``marker`` file this process creates exclusively:
    two jobs (or sweeps) started in the same second never share a directory."""
    candidate, n = path, 0
    while True:
        candidate.mkdir(parents=True, exist_ok=True)
        try:
            os.close(os.open(candidate / marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return candidate
        except FileExistsError:
            n += 1
            candidate = path.with_name(f"{path.name}_{n}")


SWEEP_FILE = "multirun.yaml"


def claim_sweep(path: Path) -> Path:
    """The sweep directory a ``-m`` sweep records itself in: ``path``, or, when another sweep started in
    the same second already holds it, the first free ``<path>_<n>``. Claimed by creating its
    ``multirun.yaml`` exclusively (Hydra then writes the sweep's record into it)."""
    return _first_free(path, SWEEP_FILE)


def command_line(job: JobDir | None) -> str | None:
    """The command that made this run, for the config's header."""
    if job is None:
        return None
    return f"python -m te_assembly {job.command} {' '.join(job.overrides) or '(no overrides)'}"


def write_config(directory: Path, config: Mapping[str, Any], job: JobDir | None = None) -> Path:
    """``<directory>/config.yaml``, written atomically (``OutputPathError`` if it cannot be)."""
    return write_text_atomic(directory / CONFIG_FILE, config_text(config, command_line(job)))


def remove_if_unused(job: JobDir) -> None:
    """A default run directory the job left empty (a config error, a resumed run that lives elsewhere)
    is removed, and so are the parents it emptied below the working directory (``outputs/<model>``)."""
    if not job.default:
        return
    here = Path.cwd().resolve()
    folder = job.path
    while folder != here and here in folder.parents:
        try:
            folder.rmdir()  # only an empty directory goes
        except OSError:
            return
        folder = folder.parent


__all__ = [
    "CONFIG_FILE",
    "SWEEP_FILE",
    "JobDir",
    "check_claimable",
    "claim",
    "claim_sweep",
    "command_line",
    "current",
    "remove_if_unused",
    "write_config",
]
