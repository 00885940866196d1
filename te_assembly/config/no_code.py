"""What a config may never do: run code or change the environment. Hydra instantiates whatever a config
names: ``_target_`` objects, ``hydra.callbacks`` and ``logging.config`` handlers (a ``FileHandler`` with
``mode: w`` truncates any file the user can write); it sets the environment variables
``hydra.job.env_set`` names (``PATH``, ``LD_PRELOAD``: the next program run is the config's) and copies
those ``hydra.job.env_copy`` names; and a ``pkg://`` entry of ``hydra.searchpath`` imports the Python
package it names. te_assembly needs none of that, so a composed config (or an override) that asks for
any of it is refused, with the key path, before Hydra acts on it (``composition.GroupConfigLoader``; the
search path before Hydra reads it).

The checks read ``hydra.*`` twice: as written, and with every interpolation that can be resolved at
composition resolved (``hydra: {callbacks: ${evil}}`` is a callback once resolved). An interpolation that
builds a config node from text (``oc.create``, ``oc.decode``) is refused anywhere under ``hydra.``: what it
builds is what Hydra instantiates or acts on, out of reach of any reading of the text.

Allowed: Hydra's own launcher and sweeper (its defaults), logging to the terminal (``StreamHandler`` on
stdout/stderr, ``NullHandler``) as the shipped ``hydra/job_logging`` and ``hydra/hydra_logging`` do, and
Hydra's default log file (``hydra/job_logging=default``: a ``FileHandler`` appending to
``${hydra.runtime.output_dir}/<name>.log``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from typing import Any

from te_assembly.diagnostics import Diagnostic, error

ALLOWED_TARGETS = {
    "hydra.launcher._target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher",
    "hydra.sweeper._target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
}
"""The ``_target_`` keys Hydra's own defaults set, and the one value each may hold."""

HANDLER_CLASSES = ("logging.StreamHandler", "logging.NullHandler")
STREAMS = ("ext://sys.stderr", "ext://sys.stdout")
LOGGING = ("hydra.job_logging", "hydra.hydra_logging")

_WHY = "te_assembly configs never run code"


def _walk(node: Any, path: str) -> Iterator[tuple[str, str, Any]]:
    """(path, key, value) of every mapping entry below ``node``."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            child = f"{path}.{key}" if path else str(key)
            yield child, str(key), value
            yield from _walk(value, child)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _walk(value, f"{path}[{index}]")


RUN_DIR_LOG = "${hydra.runtime.output_dir}/"
"""Where Hydra's default ``job_logging`` writes its log file, the one place a ``FileHandler`` may."""


JOB_NAME_LOG = "${hydra.job.name}.log"
"""The name Hydra's default ``job_logging`` gives its log file; the job's name is checked apart
(``_job_name``), as it may come from the config."""

_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_BUILDER = re.compile(r"\$\{\s*(oc\.create|oc\.decode)\s*:")


def _in_run_dir(handler: Mapping[str, Any]) -> bool:
    """A ``FileHandler`` appending to a file in the run directory, as Hydra's default logging does: its
    name is a plain one, or the job's name (no interpolation of the config's choosing in it)."""
    name = handler.get("filename")
    if not isinstance(name, str) or not name.startswith(RUN_DIR_LOG):
        return False
    rest = name.removeprefix(RUN_DIR_LOG)
    plain = rest == JOB_NAME_LOG or (_PLAIN_NAME.fullmatch(rest) is not None and ".." not in rest)
    return plain and set(handler) <= {"class", "formatter", "filename", "level"}


def _job_name(hydra: Mapping[str, Any], resolved: bool) -> list[Diagnostic]:
    """``hydra.job.name`` names the default log file (``${hydra.job.name}.log`` in the run directory):
    a path there would put it anywhere. An interpolation is judged by its value (``resolved``)."""
    job = hydra.get("job")
    name = job.get("name") if isinstance(job, Mapping) else None
    if name is None or (isinstance(name, str) and _PLAIN_NAME.fullmatch(name) and ".." not in name):
        return []
    if not resolved and isinstance(name, str) and "${" in name:
        return []
    return [
        error(
            "hydra.job.name",
            "code-in-config",
            f"hydra.job.name={name!r} is not a plain name: it names Hydra's log file, which would be written "
            "outside the run directory",
            "use letters, digits, '_', '-' and '.'",
        )
    ]


def _strings(node: Any, path: str) -> Iterator[tuple[str, str]]:
    """(path, text) of every string below ``node``, in mappings and lists."""
    if isinstance(node, str):
        yield path, node
    elif isinstance(node, Mapping):
        for key, value in node.items():
            yield from _strings(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _strings(value, f"{path}[{index}]")


def _builders(hydra: Mapping[str, Any]) -> list[Diagnostic]:
    """Every interpolation under ``hydra.`` that builds a config node from text (module docstring)."""
    out = []
    for path, text in _strings(hydra, "hydra"):
        found = _BUILDER.search(text)
        if found:
            message = f"the interpolation ${{{found.group(1)}:...}} builds a config node from text: {_WHY}"
            out.append(error(path, "code-in-config", message, "write the values out as YAML"))
    return out


def _logging(section: str, config: Any) -> list[Diagnostic]:
    if not isinstance(config, Mapping):
        return []
    out = []
    for path, key, _ in _walk(config, section):
        if key == "()":
            out.append(error(path, "code-in-config", f"a logging factory '()' builds any object: {_WHY}"))
    handlers = config.get("handlers")
    for name, handler in (handlers or {}).items() if isinstance(handlers, Mapping) else ():
        where = f"{section}.handlers.{name}"
        if not isinstance(handler, Mapping):
            continue
        cls = handler.get("class")
        if cls == "logging.FileHandler" and _in_run_dir(handler):
            continue  # Hydra's own default: a log file appended in the run directory
        if cls not in HANDLER_CLASSES:
            out.append(
                error(
                    f"{where}.class",
                    "code-in-config",
                    f"logging handler class {cls!r} is not allowed: {_WHY} and write nothing but their "
                    f"own files",
                    f"use one of {', '.join(HANDLER_CLASSES)}",
                )
            )
        stream = handler.get("stream")
        if stream is not None and stream not in STREAMS:
            out.append(
                error(
                    f"{where}.stream",
                    "code-in-config",
                    f"stream {stream!r} is not allowed",
                    f"use one of {', '.join(STREAMS)}",
                )
            )
    return out


def drop_file_handlers(config: Any) -> None:
    """Remove every ``FileHandler`` (Hydra's own log file: the only kind ``_logging`` lets through) from
    a logging section in place, and the loggers' references to them."""
    handlers = config.get("handlers") if isinstance(config, MutableMapping) else None
    if not isinstance(handlers, MutableMapping):
        return
    files = [
        name
        for name, h in handlers.items()
        if isinstance(h, Mapping) and h.get("class") == "logging.FileHandler"
    ]
    for name in files:
        del handlers[name]
    loggers = [config.get("root"), *(config.get("loggers") or {}).values()]
    for logger in loggers:
        names = logger.get("handlers") if isinstance(logger, MutableMapping) else None
        if isinstance(names, Sequence) and not isinstance(names, str):
            logger["handlers"] = [h for h in names if h not in files]  # type: ignore[index]


def refused_searchpath(entries: Any, where: str = "hydra.searchpath") -> list[Diagnostic]:
    """Every ``hydra.searchpath`` entry that is not a folder: ``pkg://module`` imports the module (and
    whatever it runs on import) when Hydra looks in it; other schemes are no folder te_assembly reads."""
    out = []
    for index, entry in enumerate(
        entries if isinstance(entries, Sequence) and not isinstance(entries, str) else []
    ):
        # An interpolation could become pkg://... by the time Hydra reads it: only inside file://.
        if isinstance(entry, str) and ("://" in entry or "${" in entry) and not entry.startswith("file://"):
            out.append(
                error(
                    f"{where}[{index}]",
                    "code-in-config",
                    f"search path {entry!r} "
                    + (
                        "imports the Python package it names"
                        if "://" in entry
                        else "is an interpolation, which could name a Python package for Hydra to import"
                    )
                    + f": {_WHY}",
                    "name a folder (file://path, or --config-dir path)",
                )
            )
    return out


def _environment(hydra: Mapping[str, Any]) -> list[Diagnostic]:
    """``hydra.job.env_set`` and ``env_copy``, which change the environment of the command and of every
    program it runs (Graphviz's ``dot``, the C++ compiler of ``compile``)."""
    job = hydra.get("job")
    if not isinstance(job, Mapping):
        return []
    out = []
    env_set = job.get("env_set")
    env_copy = job.get("env_copy")
    copied = set(env_copy) if isinstance(env_copy, Sequence) and not isinstance(env_copy, str) else set()
    for name in env_set if isinstance(env_set, Mapping) else ():
        if name in copied:  # Hydra has already copied env_copy's names into env_set: one finding each
            continue
        out.append(
            error(
                f"hydra.job.env_set.{name}",
                "code-in-config",
                f"hydra.job.env_set would set the environment variable {name}: {_WHY} nor change the "
                "environment",
                "set it in the shell that runs te_assembly, where you can see it",
            )
        )
    out.extend(refused_env_copy(list(copied) if copied else [], env_copy if copied else None))
    return out


def refused_env_copy(names: Sequence[str], listed: Any = None) -> list[Diagnostic]:
    """``hydra.job.env_copy``'s ``names`` refused (``listed``: the config's list, for each one's index)."""
    order = list(listed) if isinstance(listed, Sequence) and not isinstance(listed, str) else list(names)
    return [
        error(
            f"hydra.job.env_copy[{order.index(name)}]",
            "code-in-config",
            f"hydra.job.env_copy would copy the environment variable {name} into the config: {_WHY} "
            "nor change the environment",
        )
        for name in sorted(names, key=order.index)
    ]


def code_in_config(
    cfg: Mapping[str, Any], jobs: bool = True, resolved_hydra: Mapping[str, Any] | None = None
) -> list[Diagnostic]:
    """Every place the composed config (as plain data, unresolved) asks Hydra to build an object, and
    (``jobs``: a command will run) to write its own copies of the config; ``resolved_hydra``: its
    ``hydra`` node with what can be resolved resolved, checked again (a finding at a path already found
    is not repeated)."""
    out = _targets(cfg, "")
    raw = cfg.get("hydra")
    hydra: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    out.extend(_builders(hydra))
    out.extend(d for d in _interpolated_sections(hydra) if d.path not in {b.path for b in out})
    out.extend(_hydra_checks(hydra, out, resolved=False))
    if resolved_hydra is not None:
        found = {d.path for d in out}
        again = _targets(resolved_hydra, "hydra")
        again.extend(_hydra_checks(resolved_hydra, again, resolved=True))
        out.extend(d for d in again if not any(d.path.startswith(p) for p in found))
    if jobs and hydra.get("output_subdir") is not None:
        out.append(
            error(
                "hydra.output_subdir",
                "hydra-writes",
                f"hydra.output_subdir={hydra.get('output_subdir')!r} has Hydra write its own copies of the "
                "config (config.yaml, hydra.yaml, overrides.yaml) where the command runs, even for "
                "commands that write nothing, and over a run's own config.yaml",
                "leave it null: train, bench, graph and verify write the resolved config.yaml themselves",
            )
        )
    return out


def _targets(node: Any, path: str) -> list[Diagnostic]:
    out = []
    for child, key, value in _walk(node, path):
        if key == "_target_" and ALLOWED_TARGETS.get(child) != value:
            out.append(
                error(child, "code-in-config", f"_target_ {value!r} would build a Python object: {_WHY}")
            )
    return out


STRUCTURAL = (
    "callbacks",
    "job.env_set",
    "job.env_copy",
    "job_logging",
    "hydra_logging",
    "searchpath",
    "launcher",
    "sweeper",
)
"""The parts of ``hydra`` Hydra builds objects from or acts on: written out as YAML, never one
interpolation (whose value the checks of the text would not see)."""


def _interpolated_sections(hydra: Mapping[str, Any]) -> list[Diagnostic]:
    out = []
    for dotted in STRUCTURAL:
        node: Any = hydra
        for key in dotted.split("."):
            node = node.get(key) if isinstance(node, Mapping) else None
        if isinstance(node, str) and "${" in node:
            out.append(
                error(
                    f"hydra.{dotted}",
                    "code-in-config",
                    f"hydra.{dotted} is one interpolation ({node[:60]!r}): what Hydra acts on must be "
                    f"written out, where it can be checked: {_WHY}",
                    "write the section out as YAML",
                )
            )
    return out


def _hydra_checks(
    hydra: Mapping[str, Any], prior: Sequence[Diagnostic] = (), resolved: bool = True
) -> list[Diagnostic]:
    """Callbacks, the environment, the search path, logging and the job's name, in ``hydra``
    (``prior``: findings already made, so a callback whose ``_target_`` is refused is not found twice)."""
    out: list[Diagnostic] = []
    callbacks = hydra.get("callbacks")
    if isinstance(callbacks, Mapping):
        for name in callbacks:
            path = f"hydra.callbacks.{name}"
            if not any(d.path.startswith(path) for d in prior):
                out.append(error(path, "code-in-config", f"Hydra callbacks run Python code: {_WHY}"))
    out.extend(_environment(hydra))
    out.extend(refused_searchpath(hydra.get("searchpath")))
    out.extend(_job_name(hydra, resolved))
    for section in LOGGING:
        out.extend(_logging(section, hydra.get(section.removeprefix("hydra."))))
    return out


__all__ = [
    "ALLOWED_TARGETS",
    "HANDLER_CLASSES",
    "LOGGING",
    "code_in_config",
    "drop_file_handlers",
    "refused_env_copy",
    "refused_searchpath",
]
