"""What in a directory te_assembly wrote, and what is someone else's.

A training run is known by its lock, its checkpoints (``ckpt-*``: files, DCP folders, set-aside
``.corrupt`` ones) and its metrics; a pretrained model by its weights and config; a directory written
whole (``directory.py``) by its manifest; a ``config.yaml`` by the header te_assembly writes first in it.
Commands that write beside their results (``graph``, ``bench``, ``verify``) never write into a run or a
pretrained model, nor over a ``config.yaml`` that is not theirs.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from te_assembly.errors import OutputPathError
from te_assembly.version import __version__

LOCK_NAME = ".te_assembly.lock"
RUN_EVIDENCE = (LOCK_NAME, "ckpt-*", "metrics.jsonl")
"""What makes a directory a training run's: its lock, any checkpoint-like entry, its metrics."""
RUN_MARKERS = (*RUN_EVIDENCE, "model.safetensors")
"""What makes a directory a training run's or a pretrained model's."""
CONFIG_HEADER = "# te_assembly"
"""How every ``config.yaml`` te_assembly writes begins."""


def run_evidence(directory: Path) -> list[str]:
    """The names in ``directory`` that make it a training run (``RUN_EVIDENCE``), sorted."""
    if not directory.is_dir():
        return []
    found: set[str] = set()
    with contextlib.suppress(OSError):
        for marker in RUN_EVIDENCE:
            found.update(p.name for p in directory.glob(marker))
    return sorted(found)


def holds_a_run(directory: Path) -> bool:
    """Does ``directory`` hold a training run or a pretrained model (``RUN_MARKERS``)?"""
    return directory.is_dir() and any(any(directory.glob(marker)) for marker in RUN_MARKERS)


def check_not_a_run(directory: Path, what: str) -> None:
    """``OutputPathError`` when ``directory`` holds another run's files: ``what`` (a command's outputs)
    never goes where a training run or a pretrained model lives."""
    if holds_a_run(directory):
        raise OutputPathError(
            f"{directory} holds a training run or a pretrained model (its lock, checkpoints or weights): "
            f"{what} never writes into it; choose another directory"
        )


def is_our_config(path: Path) -> bool:
    """Whether ``path`` is a ``config.yaml`` te_assembly wrote (its header), or empty (claimed by a job
    that has not filled it yet)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(CONFIG_HEADER))
    except OSError:
        return False
    return not head or head.decode("utf-8", "replace") == CONFIG_HEADER


def check_not_theirs(path: Path, what: str) -> None:
    """``OutputPathError`` when ``path`` exists and is not a file te_assembly writes for ``what``: a
    checkpoint or weights file (``.safetensors``), or a ``config.yaml`` te_assembly did not write (a
    user's own config)."""
    if not path.exists():
        return
    if path.suffix == ".safetensors":
        raise OutputPathError(f"{path} is a checkpoint or weights file: {what} never writes over it")
    if path.name == "config.yaml" and path.is_file() and not is_our_config(path):
        raise OutputPathError(
            f"{path} is not a config te_assembly wrote (yours?): {what} never writes over it; "
            "choose another directory"
        )


def config_text(config: Mapping[str, Any], command_line: str | None = None) -> str:
    """A resolved config as YAML, with a header saying when and, if given, by which command line it was
    made: the ``config.yaml`` beside a run's results."""
    when = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    lines = [f"{CONFIG_HEADER} {__version__}: the fully resolved config of this run ({when})"]
    if command_line is not None:
        lines.append(f"# {command_line}")
    lines.append("# model and recipe as read (overrides and interpolations applied), then every setting")
    body = yaml.safe_dump(dict(config), sort_keys=False, allow_unicode=True, default_flow_style=False)
    return "\n".join(lines) + "\n" + body


__all__ = [
    "CONFIG_HEADER",
    "LOCK_NAME",
    "RUN_EVIDENCE",
    "RUN_MARKERS",
    "check_not_a_run",
    "check_not_theirs",
    "config_text",
    "holds_a_run",
    "is_our_config",
    "run_evidence",
]
