"""Diagnostics: the validator's findings as data. The CLI decides how to print them."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from enum import Enum


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True)
class Diagnostic:
    severity: Severity
    path: str
    """Config key path, e.g. ``model.ops[4].extra_inputs.split_sizes``."""
    message: str
    code: str
    """Stable rule id (``dangling-input``, ``unknown-op``...), for tests and tooling."""
    hint: str | None = None
    file: str | None = None
    line: int | None = None
    override: str | None = None
    """The command-line override that gave the value (``engine=tee``): ``file:line`` holds the default."""

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR

    def located(self, file: str | None, line: int | None) -> Diagnostic:
        return replace(self, file=file, line=line)

    def format(self) -> str:
        """One line for people; control characters from names in the config are escaped."""
        where = ""
        if self.file is not None:
            where = (
                f"{printable(self.file)}:{self.line}: "
                if self.line is not None
                else f"{printable(self.file)}: "
            )
        message = printable(self.message, keep_newlines=True)
        text = f"{where}{self.severity.value}: {printable(self.path)}: {message}"
        if self.hint:
            text += f" ({printable(self.hint, keep_newlines=True)})"
        if self.override:
            text += f" [set on the command line: {printable(self.override)}]"
        return text


# C0 and C1 controls, DEL, and the bidirectional-text controls a terminal would act on or hide behind.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_CONTROL_OR_NEWLINE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str, keep_newlines: bool = False) -> str:
    """``text`` safe to print on a terminal: control characters (a name written ``"\\e[2J"`` in
    YAML) become ``\\x1b``-style escapes, so a config cannot move the cursor, recolour or clear the
    screen. Tabs stay; newlines too when ``keep_newlines`` (messages that span lines)."""
    pattern = _CONTROL if keep_newlines else _CONTROL_OR_NEWLINE
    if not pattern.search(text):
        return text
    return pattern.sub(
        lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256 else f"\\u{ord(m.group()):04x}", text
    )


def error(path: str, code: str, message: str, hint: str | None = None) -> Diagnostic:
    return Diagnostic(Severity.ERROR, path, message, code, hint)


def warning(path: str, code: str, message: str, hint: str | None = None) -> Diagnostic:
    return Diagnostic(Severity.WARNING, path, message, code, hint)


def closest(word: object, candidates: Iterable[str]) -> str | None:
    """The candidate a misspelled name most likely meant, or None when nothing is close."""
    if not isinstance(word, str):
        return None
    pool = sorted(set(candidates))
    matches = difflib.get_close_matches(word, pool, n=1, cutoff=0.6)
    if not matches:
        lowered = {c.lower(): c for c in pool}
        if word.lower() in lowered:
            matches = [lowered[word.lower()]]
    return matches[0] if matches else None


def did_you_mean(word: object, candidates: Iterable[str]) -> str | None:
    """A did-you-mean hint for a misspelled name, or None when nothing is close."""
    match = closest(word, candidates)
    return f"did you mean {match!r}?" if match is not None else None


_PATH_TOKEN = re.compile(r"\[(\d+)\]|([^.\[\]]+)")


def path_sort_key(path: str) -> tuple[tuple[int, int | str], ...]:
    """Order paths by position: list indices numerically, keys by name."""
    key: list[tuple[int, int | str]] = []
    for index, name in _PATH_TOKEN.findall(path):
        key.append((0, int(index)) if index else (1, name))
    return tuple(key)


def sort_diagnostics(diagnostics: Iterable[Diagnostic], files: Sequence[str | None] = ()) -> list[Diagnostic]:
    """Source order: file by file (in the order of ``files``, others after), by line where known (a
    step's ``name`` precedes its ``args``), then by path."""
    rank = {f: i for i, f in enumerate(files)}
    return sorted(
        diagnostics,
        key=lambda d: (
            rank.get(d.file, len(rank)),
            d.line is None,
            d.line or 0,
            path_sort_key(d.path),
            d.severity is Severity.WARNING,
            d.code,
        ),
    )


def has_errors(diagnostics: Iterable[Diagnostic]) -> bool:
    return any(d.is_error for d in diagnostics)


# When one of these is reported at a path, the others there are consequences of it.
_ROOT_CAUSES = {
    "bad-channel-name": {"wrong-type"},
}
# A value that could not be resolved is absent: every other error about it, or about anything under it
# ("missing required key", "needs argument", "exactly one of op or module"), only restates that.
_UNRESOLVED = "bad-interpolation"


def dedupe(diags: list[Diagnostic]) -> list[Diagnostic]:
    """Drop repeats, and findings that are only consequences of a root cause at the same path."""
    causes: dict[str, set[str]] = {}
    unresolved: set[str] = set()
    for d in diags:
        causes.setdefault(d.path, set()).add(d.code)
        if d.code == _UNRESOLVED:
            unresolved.add(d.path)
    seen: set[tuple[str, str, str]] = set()
    out = []
    for d in diags:
        key = (d.path, d.code, d.message)
        shadowed = any(d.code in _ROOT_CAUSES.get(c, ()) for c in causes[d.path]) or (
            bool(unresolved)
            and d.is_error
            and d.code != _UNRESOLVED
            and any(p in unresolved for p in _enclosing(d.path))
        )
        if key not in seen and not shadowed:
            seen.add(key)
            out.append(d)
    return out


def _enclosing(path: str) -> list[str]:
    """``path`` and each path above it: ``a.b[2].c``, ``a.b[2]``, ``a.b``, ``a``."""
    out = [path]
    while True:
        cut = max(path.rfind("."), path.rfind("["))
        if cut <= 0:
            return out
        path = path[:cut]
        out.append(path)
