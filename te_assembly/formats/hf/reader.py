"""Reading one ``config.json``'s fields, each refusal collected with its key's line: what
``config.py`` and every family (``families/``) read a checkpoint's config through."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from te_assembly.catalog import MODULE_ALLOWLIST, OPS
from te_assembly.diagnostics import Diagnostic, error
from te_assembly.fields import check_value
from te_assembly.files.read import LIMITS, InputFileError, read_text

_KEY = re.compile(r'"((?:[^"\\]|\\.)*)"\s*:')


def key_lines(path: Path) -> dict[str, int]:
    """The line of each key's first appearance in ``path`` (read once; empty when it cannot be read):
    every refusal of a field is located without reading the file again."""
    try:
        text = read_text(path, limit=LIMITS["metadata"])
    except InputFileError:
        return {}
    lines: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        for match in _KEY.finditer(line):
            lines.setdefault(match.group(1), number)
    return lines


def located(
    diagnostic: Diagnostic, path: Path, lines: Mapping[str, int], key: str | None = None
) -> Diagnostic:
    """``diagnostic`` at ``key``'s line (a nested key, ``rope_scaling.factor``, at its last part's)."""
    line = None
    if key is not None:
        line = lines.get(key) or lines.get(key.split(".")[-1]) or lines.get(key.split(".")[0])
    return diagnostic.located(str(path), line)


def shown(value: Any, width: int = 60) -> str:
    """``repr(value)``, cut to ``width`` characters (a hostile value may be megabytes long)."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


class ConfigReader:
    """Reads fields of one config, collecting every refusal."""

    def __init__(
        self, data: Mapping[str, Any], path: Path, architecture: str, ignore: Sequence[str] = ()
    ) -> None:
        self.data = data
        self.ignore = set(ignore)
        self.path = path
        self.architecture = architecture
        self.problems: list[Diagnostic] = []
        self.lines = key_lines(path)

    def refuse(self, key: str, message: str, hint: str | None = None, code: str = "hf-unsupported") -> None:
        self.problems.append(
            located(error(f"config.json:{key}", code, message, hint), self.path, self.lines, key)
        )

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def integer(self, key: str, default: Any = None, minimum: int = 1) -> int:
        value = self.data.get(key, default)
        if value is None or isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.refuse(key, f"{key} = {shown(value)}: expected an integer >= {minimum}", code="hf-bad-value")
            return max(minimum, 1)
        return value

    def number(
        self, key: str, default: Any = None, positive: bool = True, becomes: tuple[str, str] | None = None
    ) -> float:
        """A finite number; ``becomes``: the op argument it turns into (``("RMSNorm", "eps")``), whose
        catalog bounds it must meet too, so an implausible value is refused here, at its own line."""
        return self.checked_number(key, self.data.get(key, default), positive, becomes)

    def checked_number(
        self, key: str, value: Any, positive: bool = True, becomes: tuple[str, str] | None = None
    ) -> float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or (positive and value <= 0):
            self.refuse(
                key,
                f"{key} = {shown(value)}: expected a finite{' positive' if positive else ''} number",
                code="hf-bad-value",
            )
            return 1.0
        if becomes is not None:
            owner, name = becomes
            param = (OPS.get(owner) or MODULE_ALLOWLIST[owner]).param(name)
            assert param is not None, becomes
            found = check_value(param.spec, float(value), f"config.json:{key}", key)
            if found:
                self.refuse(key, f"{found[0].message} ({owner}'s {name})", code="hf-bad-value")
                usable = isinstance(param.default, (int, float)) and not isinstance(param.default, bool)
                return float(param.default) if usable else 1.0  # a stand-in: the import is refused
        return float(value)

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.data.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.refuse(key, f"{key} = {shown(value)}: expected true or false", code="hf-bad-value")
            return default
        return value

    def require(self, key: str, allowed: Callable[[Any], bool], supported: str) -> None:
        if key in self.data and not allowed(self.data[key]):
            self.refuse(
                key,
                f"{key} = {shown(self.data[key])} is not supported by te_assembly's {self.architecture} "
                f"import: supported: {supported}",
            )


__all__ = ["ConfigReader", "key_lines", "located", "shown"]
