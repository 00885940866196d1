"""Pass 1 of the config pipeline: a YAML file read and parsed exactly once, into plain data and a map
from key paths to lines.

One libyaml ``compose`` gives the node tree; one walk over it builds the plain data (dicts, lists,
str/int/float/bool/None), notes every string holding an interpolation (so pass 2 need not walk again)
and reports what the data cannot hold: duplicate keys, tags that would build objects, non-scalar keys.
The node tree is kept for ``LineMap``, which finds a key path's line only when a diagnostic asks.

Hostile files are refused before they cost much, each with file and line:

- larger than ``MAX_BYTES``;
- not UTF-8;
- nested deeper than ``MAX_DEPTH`` (libyaml itself stops at 1000);
- aliases that expand to more than ``MAX_VALUES`` values ("billion laughs").

Scalars resolve as Hydra/OmegaConf resolve them (YAML 1.1; ``1e3`` is a float; dates stay strings), so
a value means the same in a model file as on the command line. Pure Python: no torch, no OmegaConf.
"""

from __future__ import annotations

import logging
import re
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from te_assembly.collector import paused
from te_assembly.config.line_map import Key, LineMap, split_path
from te_assembly.diagnostics import Diagnostic, error
from te_assembly.files import read as files_read

log = logging.getLogger(__name__)

PREFIXES = {"model": "model", "recipe": "recipe", "block": "block"}
"""The key path each kind of file's root stands for."""

MAX_BYTES = 32 * 2**20
"""Largest config file read (a 10,000-step model is about 1 MB)."""
MAX_DEPTH = 64
"""Deepest nesting of mappings and lists (a model needs about 6)."""
MAX_VALUES = 2_000_000
"""Most values a document may expand to once aliases are followed."""

_TAG = "tag:yaml.org,2002:"
_STR, _INT, _FLOAT, _BOOL, _NULL = (_TAG + t for t in ("str", "int", "float", "bool", "null"))
_MAP, _SEQ, _MERGE = _TAG + "map", _TAG + "seq", _TAG + "merge"


_PLAIN = "te_assembly:plain"
"""Tag of a plain (unquoted) scalar until the walk resolves it."""


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """libyaml's parser with Hydra's scalar rules: ``1e3`` and ``1_000.5`` are floats (YAML 1.1 wants a
    dot), and timestamps are plain strings (OmegaConf has no date type). Plain scalars are tagged
    ``_PLAIN`` and resolved by the walk, which visits each once anyway: most are names, and a name that
    cannot be a number, bool or null needs no regular expression."""

    def resolve(self, kind: type, value: str, implicit: tuple[bool, bool]) -> str:
        if kind is ScalarNode and implicit[0]:
            return _PLAIN
        return super().resolve(kind, value, implicit)


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in rules if tag != _TAG + "timestamp"]
    for first, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
        |\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)
_CONSTRUCT = yaml.constructor.SafeConstructor()
_PLAIN_INT = re.compile(r"-?(?:0|[1-9][0-9]*)")
_MAYBE_NOT_STR = frozenset("-+0123456789.~nNyYtTfFoO<=")
"""First characters of plain scalars that may resolve to something other than a string."""


def _implicit_tag(value: str) -> str:
    """The tag YAML 1.1 (with Hydra's floats, without timestamps) gives a plain scalar."""
    if value and value[0] not in _MAYBE_NOT_STR:
        return _STR
    for tag, regexp in _Loader.yaml_implicit_resolvers.get(value[:1] if value else "", []):
        if regexp.match(value):
            return _STR if tag in _STRING_LIKE else str(tag)
    return _STR


_STRING_LIKE = (_TAG + "value", _TAG + "yaml")
"""YAML 1.1 tags for ``=`` and friends, which SafeLoader cannot build: plain strings here, as in Hydra."""


# --------------------------------------------------------------------------------------------- source


@dataclass(frozen=True)
class Source:
    """One config file after pass 1. ``data`` is None when the file could not be read or parsed; the
    reason is in ``diagnostics`` (with file and line)."""

    kind: str
    """``model``, ``recipe``, ``config``..."""
    file: str | None
    """As shown in diagnostics."""
    data: Any
    lines: LineMap = field(default_factory=LineMap)
    diagnostics: tuple[Diagnostic, ...] = ()
    interpolations: tuple[tuple[Key, ...], ...] = ()
    """Key paths (below the root) of the strings that hold ``${...}``."""

    @property
    def ok(self) -> bool:
        return not any(d.is_error for d in self.diagnostics)

    def locate(self, diag: Diagnostic) -> Diagnostic:
        """``diag`` with this file and the line of its key path, when the path lies in this file."""
        if diag.file is not None or self.file is None:
            return diag
        line = self.lines.line(diag.path)
        return diag if line is None else diag.located(self.file, line)


class _Walk:
    """Builds plain data from the node tree, collecting problems instead of stopping at the first."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.problems: list[tuple[str, str, str, int]] = []  # (path, code, message, line)
        self.interpolations: list[tuple[Key, ...]] = []

    def problem(self, keys: tuple[Key, ...], code: str, message: str, node: Node) -> None:
        self.problems.append((_join(self.prefix, keys), code, message, node.start_mark.line + 1))

    def build(self, node: Node, keys: tuple[Key, ...]) -> Any:
        if node.__class__ is ScalarNode:
            return self.scalar(node, keys)
        if len(keys) >= MAX_DEPTH:
            self.problem(keys[:8], "too-deep", f"nested deeper than {MAX_DEPTH} levels", node)
            return None
        if node.__class__ is MappingNode:
            if node.tag != _MAP:
                self.problem(keys, "yaml-tag", _tag_message(node.tag), node)
                return None
            return self.mapping(node, keys)
        if node.tag != _SEQ:
            self.problem(keys, "yaml-tag", _tag_message(node.tag), node)
            return None
        return [self.child(item, keys, i) for i, item in enumerate(node.value)]

    def child(self, node: Node, keys: tuple[Key, ...], key: Key) -> Any:
        # The common leaf (a plain string or small int) without building its key path.
        if node.__class__ is ScalarNode and node.tag == _PLAIN:
            value = node.value
            if value and value[0] not in _MAYBE_NOT_STR and "${" not in value:
                return value
            if 0 < len(value) < 19 and _PLAIN_INT.fullmatch(value):
                return int(value)
        return self.build(node, (*keys, key))

    def mapping(self, node: MappingNode, keys: tuple[Key, ...]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        first_line: dict[str, int] = {}
        merged: list[dict[str, Any]] = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE or (key_node.tag == _PLAIN and key_node.value == "<<"):
                merged.extend(self.merge_sources(value_node, keys))
                continue
            if key_node.__class__ is not ScalarNode:
                self.problem(
                    keys, "bad-key", "a mapping key must be a plain name, not a list or mapping", key_node
                )
                continue
            name = key_node.value
            line = key_node.start_mark.line + 1
            if name in first_line:
                self.problem(
                    (*keys, name),
                    "duplicate-key",
                    f"duplicate key {name!r} (first at line {first_line[name]})",
                    key_node,
                )
            else:
                first_line[name] = line
            out[name] = self.child(value_node, keys, name)
        for source in merged:  # YAML merge keys (``<<: *base``): explicit keys win
            for name, value in source.items():
                out.setdefault(name, value)
        return out

    def merge_sources(self, node: Node, keys: tuple[Key, ...]) -> Iterator[dict[str, Any]]:
        items = node.value if isinstance(node, SequenceNode) else [node]
        for item in items:
            value = self.build(item, keys)
            if isinstance(value, dict):
                yield value
            else:
                self.problem(
                    keys, "yaml-merge", "a merge key (<<) takes a mapping or a list of mappings", item
                )

    def scalar(self, node: ScalarNode, keys: tuple[Key, ...]) -> Any:
        tag, value = node.tag, node.value
        if tag == _PLAIN:
            tag = _implicit_tag(value)
        if tag == _STR:
            if "${" in value:
                self.interpolations.append(keys)
            return value
        if tag == _INT:
            if _PLAIN_INT.fullmatch(value) and len(value) < 4000:
                return int(value)
            return self.constructed(node, keys, _CONSTRUCT.construct_yaml_int)
        if tag == _FLOAT:
            return self.constructed(node, keys, _CONSTRUCT.construct_yaml_float)
        if tag == _BOOL:
            return value.lower() in ("yes", "true", "on", "y")
        if tag == _NULL:
            return None
        self.problem(keys, "yaml-tag", _tag_message(tag), node)
        return None

    def constructed(self, node: ScalarNode, keys: tuple[Key, ...], construct: Any) -> Any:
        try:
            return construct(node)
        except ValueError as exc:  # e.g. an integer literal beyond Python's digit limit
            self.problem(keys, "bad-number", f"cannot read number: {str(exc).splitlines()[0]}", node)
            return None


def _tag_message(tag: str) -> str:
    short = tag.replace(_TAG, "!!")
    return f"unsupported YAML tag {short!r}: configs hold plain values, never Python objects"


def _join(prefix: str, keys: tuple[Key, ...]) -> str:
    out = prefix
    for key in keys:
        out = f"{out}[{key}]" if isinstance(key, int) else (f"{out}.{key}" if out else str(key))
    return out


class _RecursiveAlias(Exception):
    def __init__(self, node: Node) -> None:
        self.node = node


def _expanded_size(root: Node, limit: int) -> int:
    """Values the document holds once every alias is followed, stopping early past ``limit``; raises
    ``_RecursiveAlias`` for an alias inside the node it names (which would expand forever)."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: Node) -> int:
        known = sizes.get(id(node))
        if known is not None:
            return known
        if id(node) in active:
            raise _RecursiveAlias(node)
        active.add(id(node))
        total = 1
        if isinstance(node, MappingNode):
            for k, v in node.value:
                total += size(k) + size(v)
                if total > limit:
                    break
        elif isinstance(node, SequenceNode):
            for v in node.value:
                total += size(v)
                if total > limit:
                    break
        active.discard(id(node))
        sizes[id(node)] = total
        return total

    return size(root)


def cycle_in(data: Any, path: str = "") -> str | None:
    """The key path of the first mapping or list that contains itself in ``data`` (plain Python data, as
    ``build()`` and ``load()`` take), or None. Iterative, so no depth of data overflows the stack."""
    stack: list[tuple[Any, str, bool]] = [(data, path, False)]
    active: set[int] = set()
    done: set[int] = set()
    while stack:
        node, where, leaving = stack.pop()
        if leaving:
            active.discard(id(node))
            done.add(id(node))
            continue
        if not isinstance(node, (dict, list)) or id(node) in done:
            continue
        if id(node) in active:
            return where
        active.add(id(node))
        stack.append((node, where, True))
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            child = f"{where}[{key}]" if isinstance(node, list) else f"{where}.{key}".lstrip(".")
            stack.append((value, child, False))
    return None


def parse_text(text: str, file: str | None, kind: str, prefix: str) -> Source:
    """Parse one YAML document whose root stands for key path ``prefix``; see the module docstring."""
    with paused():  # parsing makes ~30 objects per key; see collector.py
        return _parse(text, file or "<string>", kind, prefix)


def _parse(text: str, where: str, kind: str, prefix: str) -> Source:
    def fail(code: str, message: str, line: int | None) -> Source:
        diag = error(prefix or kind, code, message).located(where, line)
        return Source(kind, where, None, LineMap(), (diag,))

    try:
        root = yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        return fail("yaml-syntax", *_syntax_problem(exc, text))
    except RecursionError:
        return fail("too-deep", f"nested deeper than {MAX_DEPTH} levels", None)
    if root is None:
        return Source(kind, where, None, LineMap(None, prefix))
    try:
        expanded = _expanded_size(root, MAX_VALUES) if "&" in text else 0
    except _RecursiveAlias as exc:
        line = exc.node.start_mark.line + 1
        message = "an alias refers to a node that contains it: the document would be infinitely deep"
        return fail("yaml-aliases", f"{message} (a recursive alias at line {line})", line)
    if expanded > MAX_VALUES:
        message = (
            f"aliases expand this document to more than {MAX_VALUES:,} values (a 'billion laughs' "
            "document?); write the values out, or use fewer nested aliases"
        )
        return fail("yaml-aliases", message, 1)
    walk = _Walk(prefix)
    try:
        data = walk.build(root, ())
    except RecursionError:
        return fail("too-deep", f"nested deeper than {MAX_DEPTH} levels", None)
    diags = tuple(
        error(path or prefix or kind, code, msg).located(where, line)
        for path, code, msg, line in walk.problems
    )
    return Source(kind, where, data, LineMap(root, prefix), diags, tuple(walk.interpolations))


def _syntax_problem(exc: yaml.YAMLError, text: str) -> tuple[str, int | None]:
    """libyaml's error, in the pure-Python parser's clearer words when that one agrees it is an error."""
    try:
        yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as slow:
        exc = slow
    except RecursionError:
        pass
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).strip().splitlines()[0]
    if "maximum nesting depth" in problem:
        problem = f"nested too deeply (configs allow {MAX_DEPTH} levels)"
    return f"YAML syntax error: {problem}", (mark.line + 1 if mark is not None else None)


def read_bytes(raw: bytes, file: str | None, kind: str, prefix: str) -> Source:
    """``parse_text`` of file contents, after the size and encoding checks."""
    where = file or "<string>"
    if len(raw) > MAX_BYTES:
        return _too_large(len(raw), where, kind, prefix)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        message = f"not UTF-8 text: byte 0x{raw[exc.start]:02x} cannot be decoded (save the file as UTF-8)"
        return Source(
            kind,
            where,
            None,
            LineMap(),
            (error(prefix or kind, "bad-encoding", message).located(where, line),),
        )
    return parse_text(text, where, kind, prefix)


def _too_large(size: int, where: str, kind: str, prefix: str) -> Source:
    message = f"the file is {size / 2**20:.1f} MiB; config files are limited to {MAX_BYTES // 2**20} MiB"
    return Source(
        kind, where, None, LineMap(), (error(prefix or kind, "file-too-large", message).located(where, None),)
    )


def read_file(path: str | Path, kind: str, prefix: str, within: str | Path | None = None) -> Source:
    """Read and parse ``path`` once (see the module docstring) through the shared bounded reader
    (``files.read``: regular files only, at most ``MAX_BYTES``, inside ``within`` when given); never
    raises for a bad file."""
    where = str(path)
    try:
        raw = files_read.read_bytes(path, limit=MAX_BYTES, within=within)
    except files_read.InputFileError as exc:
        if exc.code == "file-too-large":
            size = Path(path).stat().st_size if Path(path).is_file() else MAX_BYTES + 1
            return _too_large(size, where, kind, prefix)
        if exc.code == "outside-folder":
            found = error(prefix or kind, "outside-folder", f"{where}: {exc.problem}")
        elif exc.code in ("no-such-file", "not-a-file"):
            what = "does not exist" if exc.code == "no-such-file" else exc.problem.removeprefix("it ")
            found = error(prefix or kind, "no-such-file", f"{where} {what}")
        else:
            found = error(prefix or kind, "unreadable-file", f"cannot read {where}: {exc.problem}")
        return Source(kind, where, None, LineMap(), (found.located(where, None),))
    return read_bytes(raw, where, kind, prefix)


__all__ = [
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_VALUES",
    "PREFIXES",
    "LineMap",
    "Source",
    "parse_text",
    "read_bytes",
    "read_file",
    "read_source",
    "split_path",
]


# ------------------------------------------------------------------------------------------- reading

_CACHE: OrderedDict[tuple[Any, ...], Source] = OrderedDict()
_CACHE_SIZE = 4
"""Parsed files kept (a 10,000-step model's source is about 50 MiB with its line map)."""


def read_source(location: str, kind: str, prefix: str | None = None) -> Source:
    """The parsed file at ``location`` (a path, or ``pkg://module/file``). A file unchanged since it
    was last read in this process (same size, modification time and inode) is not parsed again:
    a sweep over one model parses it once. ``prefix``: the key path its root stands for (default: the
    kind's, ``model``...; a block's is ``block.<name>``)."""
    prefix = PREFIXES.get(kind, "") if prefix is None else prefix
    if location.startswith("pkg://"):
        module, _, relative = location.removeprefix("pkg://").partition("/")
        return read_bytes(resources.files(module).joinpath(relative).read_bytes(), location, kind, prefix)
    try:
        stat = Path(location).stat()
        key: tuple[Any, ...] | None = (location, kind, prefix, stat.st_size, stat.st_mtime_ns, stat.st_ino)
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
