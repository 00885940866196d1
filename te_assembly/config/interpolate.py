"""Pass 2, interpolations: every ``${...}`` in the model and recipe resolved once, leaf by leaf, so each
bad one is reported at its own key path and the rest still resolve.

The forms configs use are resolved here directly: a whole-value reference ``${model.dims.hidden}`` (its
target keeps its type; a target that is itself an interpolation is resolved first, cycles reported) and
``${mul:2,${model.dims.ffn}}`` and ``${add:...}`` (numbers only: ``${mul:abc,100000000}`` is an error, not a
300 MB string).
Any other interpolation (``${oc.env:H}``, a relative ``${..x}``, text around a reference) is handed, one
leaf at a time, to OmegaConf with a small root built from the rest of the config, so the model's steps
never become OmegaConf nodes unless such a leaf sits among them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from te_assembly.config.source import MAX_DEPTH, MAX_VALUES, Key
from te_assembly.diagnostics import Diagnostic, closest, error
from te_assembly.errors import InterpolationError, first_line

_REF = re.compile(r"\$\{\s*([A-Za-z_][\w]*(?:\.[A-Za-z_\w][\w]*|\[\d+\])*)\s*\}")
_ARITHMETIC = re.compile(r"\$\{\s*(mul|add)\s*:(.*)\}", re.S)
_RESOLVER = re.compile(r"\$\{\s*([A-Za-z_][\w.]*)\s*:")
MAX_CHAIN = MAX_DEPTH
"""References followed one through another at most (a config nested this deep is refused too)."""
MAX_STRING = MAX_VALUES
"""Characters a resolved string may hold at most (as many as values an alias may expand to)."""
FILE_ROOTS = ("model", "recipe", "block")
"""Sections read from te_assembly's own files: resolvers that read the environment or files are refused
there (the command line and the settings sections may still use them)."""
_NUMBER = re.compile(r"[-+]?(?:\d[\d_]*)?(?:\.\d[\d_]*)?(?:[eE][-+]?\d+)?")
_MISSING_KEY = re.compile(r"Interpolation key '([^']+)' not found")


def _numbers(name: str, values: Sequence[Any]) -> None:
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{name} takes numbers, got {v!r}")


def _finite(name: str, values: Sequence[Any], result: Any) -> Any:
    if isinstance(result, float) and not math.isfinite(result):
        raise ValueError(f"{name} of {', '.join(map(str, values))} is not a finite number")
    return result


def check_mul(*factors: Any) -> Any:
    """``${mul:a,b,...}``: the product of numbers (bools and strings are refused)."""
    _numbers("mul", factors)
    return _finite("mul", factors, math.prod(factors))


def check_add(*terms: Any) -> Any:
    """``${add:a,b,...}``: the sum of numbers, e.g. a packed QKV width
    ``${mul:${add:${block.dims.heads},${mul:2,${block.dims.kv_heads}}},${block.dims.head_dim}}``."""
    _numbers("add", terms)
    return _finite("add", terms, sum(terms))


ARITHMETIC: dict[str, Callable[..., Any]] = {"mul": check_mul, "add": check_add}


def register_resolvers() -> None:
    """``mul`` for OmegaConf too (the fallback, and Hydra's own composition of the settings)."""
    from omegaconf import OmegaConf

    for name, function in ARITHMETIC.items():
        OmegaConf.register_new_resolver(name, function, replace=True)
    # ``hydra.run.dir``'s ``${dir_name:${hydra:runtime.choices.model},${hf}}``: the run's folder name.
    from te_assembly.config.locations import run_dir_name

    OmegaConf.register_new_resolver("dir_name", run_dir_name, replace=True)


def _get(data: Any, keys: Sequence[Key]) -> Any:
    node = data
    for key in keys:
        if isinstance(node, Mapping):
            node = node[str(key)]
        elif isinstance(node, list):
            index = key if isinstance(key, int) else int(key)
            if index < 0:
                raise IndexError(index)
            node = node[index]
        else:
            raise KeyError(key)
    return node


def _parse_ref(text: str) -> list[Key]:
    return [int(i) if i else k for k, i in re.findall(r"([A-Za-z_\w]+)|\[(\d+)\]", text)]


class Interpolator:
    """Resolves the interpolation sites of the sections in ``roots`` (``{"model": {...}}``) in place of
    copies; ``context()`` gives the rest of the config for the OmegaConf fallback."""

    def __init__(self, roots: dict[str, Any], context: Callable[[], dict[str, Any]] | None = None) -> None:
        """``roots``: each top-level section by name (``model``, ``recipe``, ``seed``, ``train``...);
        ``context``: anything else an OmegaConf fallback may refer to."""
        self.roots = roots
        self.context = context or dict
        self.done: dict[tuple[Key, ...], Any] = {}
        self.failed: dict[tuple[Key, ...], InterpolationError] = {}
        self.active: list[tuple[Key, ...]] = []
        self._omegaconf_root: Any = None

    def value(self, path: tuple[Key, ...]) -> Any:
        """The resolved value at ``path`` (first key: a root's name)."""
        if path in self.done:
            return self.done[path]
        if path in self.failed:
            raise self.failed[path]
        raw = _get(self.roots, path)
        if not (isinstance(raw, str) and "${" in raw):
            return raw
        if path in self.active:
            cycle = " -> ".join(_dotted(p) for p in [*self.active[self.active.index(path) :], path])
            raise InterpolationError(f"cannot resolve value: interpolation cycle {cycle}")
        if len(self.active) >= MAX_CHAIN:
            raise InterpolationError(
                f"cannot resolve value: a chain of more than {MAX_CHAIN} references "
                f"({_dotted(self.active[0])} -> ... -> {_dotted(path)})",
                "refer to the value itself rather than through a long chain of others",
                long_chain=True,
            )
        self.active.append(path)
        try:
            result = self._resolve(raw, path)
        except InterpolationError as exc:
            self.failed[path] = exc
            raise
        finally:
            self.active.pop()
        if isinstance(result, str) and len(result) > MAX_STRING:
            error_ = InterpolationError(
                f"cannot resolve value: it would be a string of {len(result):,} characters (more than "
                f"{MAX_STRING:,}: interpolations that repeat others grow exponentially)"
            )
            self.failed[path] = error_
            raise error_
        self.done[path] = result
        return result

    def _resolve(self, text: str, path: tuple[Key, ...]) -> Any:
        whole = _REF.fullmatch(text.strip())
        if whole is not None:
            keys = _parse_ref(whole.group(1))
            if keys and keys[0] in self.roots:
                return self._lookup(tuple(keys), whole.group(1))
        arithmetic = _ARITHMETIC.fullmatch(text.strip())
        if arithmetic is not None:
            args = _split_args(arithmetic.group(2))
            if args is not None:
                return self._arithmetic(ARITHMETIC[arithmetic.group(1)], args, path)
        return self._fallback(text, path)

    def _lookup(self, keys: tuple[Key, ...], shown: str) -> Any:
        try:
            value = self.value(keys)
        except (KeyError, IndexError, ValueError, TypeError):
            raise InterpolationError(
                f"cannot resolve value: Interpolation key '{shown}' not found",
                suggest_key(self.roots, shown),
            ) from None
        if isinstance(value, (Mapping, list)):  # a whole subtree: resolve what it holds too
            inner = find_sites(value)
            if inner:
                value = _rebuild(value, [(site, self.value((*keys, *site))) for site in inner])
        return value

    def _arithmetic(self, function: Callable[..., Any], args: list[str], path: tuple[Key, ...]) -> Any:
        factors: list[Any] = []
        for arg in args:
            if _NUMBER.fullmatch(arg) and any(c.isdigit() for c in arg):
                factors.append(_number(arg))
            elif arg.startswith("${"):
                factors.append(self._resolve(arg, path))
            else:
                factors.append(arg.strip("'\""))
        try:
            return function(*factors)
        except (TypeError, ValueError) as exc:
            raise InterpolationError(f"cannot resolve value: {exc}") from None

    def _splice(self, text: str) -> str:
        """``text`` with each reference to a scalar of ``roots`` replaced by its resolved value (memoized,
        bounded), so OmegaConf never re-resolves a chain of them itself, which can take time exponential
        in its length (``${a}${a}`` at every level)."""

        def value_of(match: re.Match[str]) -> str:
            keys = _parse_ref(match.group(1))
            if not keys or keys[0] not in self.roots:
                return match.group(0)
            value = self._lookup(tuple(keys), match.group(1))
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                return match.group(0)
            return str(value)

        spliced = _REF.sub(value_of, text)
        if len(spliced) > MAX_STRING:
            raise InterpolationError(
                f"cannot resolve value: it would be a string of {len(spliced):,} characters (more than "
                f"{MAX_STRING:,}: interpolations that repeat others grow exponentially)"
            )
        return spliced

    def _fallback(self, text: str, path: tuple[Key, ...]) -> Any:
        from omegaconf import OmegaConf

        if path and path[0] in FILE_ROOTS:
            refused = [name for name in _RESOLVER.findall(text) if name not in ARITHMETIC]
            if refused:
                raise InterpolationError(
                    f"${{{refused[0]}:...}} is not allowed in a {path[0]} file: only references and "
                    "${mul:...}/${add:...} are (a value read from the environment or a file would be "
                    "written into config.yaml, checkpoints and exports)",
                    "give the value itself, or set it from the command line",
                )

        text = self._splice(text)
        if "${" not in text:
            return text
        register_resolvers()
        node, key = self._omegaconf_parent(text, path)
        try:
            node[key] = text
            value = node[key]
            return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        except Exception as exc:
            message = first_line(exc)
            missing = _MISSING_KEY.search(message)
            hint = suggest_key(self.roots, missing.group(1)) if missing else None
            raise InterpolationError(f"cannot resolve value: {message}", hint) from None

    def _omegaconf_parent(self, text: str, path: tuple[Key, ...]) -> tuple[Any, Key]:
        """The OmegaConf node that would hold ``path``, in a root with the rest of the config. The
        model's steps are left out unless this leaf is among them or looks at them."""
        from omegaconf import OmegaConf

        needs_ops = "ops" in text or text.count("${.") > 0 or (len(path) > 1 and path[1] == "ops")
        if self._omegaconf_root is None or (needs_ops and not self._with_ops):
            plain = {**self.context(), **{name: self._shallow(name, needs_ops) for name in self.roots}}
            self._omegaconf_root = OmegaConf.create(plain)
            self._with_ops = needs_ops
        node = self._omegaconf_root
        for key in path[:-1]:
            node = node[key]
        return node, path[-1]

    _with_ops = False

    def _shallow(self, name: str, with_ops: bool) -> Any:
        data = self.roots[name]
        if isinstance(data, Mapping) and not with_ops:
            return {k: v for k, v in data.items() if k != "ops"}
        return data


def _dotted(path: Sequence[Key]) -> str:
    out = ""
    for key in path:
        out = f"{out}[{key}]" if isinstance(key, int) else (f"{out}.{key}" if out else str(key))
    return out


def _number(text: str) -> int | float:
    cleaned = text.replace("_", "")
    try:
        return int(cleaned)
    except ValueError:
        return float(cleaned)


def _split_args(body: str) -> list[str] | None:
    """Resolver arguments split at top-level commas; None when nesting is unbalanced."""
    args: list[str] = []
    current: list[str] = []
    depth = 0
    for c in body:
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth < 0:
                return None
        if c == "," and depth == 0:
            args.append("".join(current).strip())
            current = []
        else:
            current.append(c)
    if depth != 0:
        return None
    args.append("".join(current).strip())
    return args


def resolve_sites(
    interpolator: Interpolator, root: str, sites: Sequence[tuple[Key, ...]], prefix: str
) -> tuple[Any, list[Diagnostic]]:
    """Section ``root`` of the interpolator with every site resolved, as new data (the input is not
    modified); a site that fails is left out (a list item becomes null) with one diagnostic."""
    data = interpolator.roots[root]
    diags: list[Diagnostic] = []
    if not sites:
        return data, diags
    if sites == [()]:  # the section is a single value (``seed: ${oc.env:SEED}``)
        try:
            return interpolator.value((root,)), diags
        except InterpolationError as exc:
            return DROPPED, [error(prefix, "bad-interpolation", str(exc), exc.hint)]
    resolved: list[tuple[tuple[Key, ...], Any]] = []
    chained: list[str] = []  # values refused for a too-long chain: one diagnostic says it for all
    chained_parent: tuple[Key, ...] = ()
    first = 0
    for keys in sites:
        try:
            resolved.append((keys, interpolator.value((root, *keys))))
        except InterpolationError as exc:
            # Collapsed among siblings only (model.dims.*): a value used elsewhere keeps its own line,
            # so nothing reads as missing where it was set.
            if exc.long_chain and chained and keys[:-1] == chained_parent:
                chained.append(_dotted([prefix, *keys]))
            else:
                diags.append(error(_dotted([prefix, *keys]), "bad-interpolation", str(exc), exc.hint))
                if exc.long_chain and not chained:
                    chained.append(_dotted([prefix, *keys]))
                    chained_parent, first = keys[:-1], len(diags) - 1
            resolved.append((keys, _DROP))
        except (KeyError, IndexError, TypeError, ValueError):
            continue  # the site was replaced by an override: nothing to resolve there
    if len(chained) > 1:
        more = len(chained) - 1
        diags[first] = replace(
            diags[first],
            message=f"{diags[first].message}; {more:,} more value(s) in chains this long fail alike "
            f"({', '.join(chained[1:4])}{', ...' if more > 3 else ''})",
        )
    return _rebuild(data, resolved), diags


_DROP = object()
DROPPED = object()
"""What ``resolve_sites`` returns for a whole section that did not resolve."""


def _rebuild(data: Any, values: list[tuple[tuple[Key, ...], Any]]) -> Any:
    """A copy of ``data`` with each path set to its value, copying only the containers on those paths."""
    out = _copy(data)
    copied: set[tuple[Key, ...]] = {()}
    for keys, value in values:
        node = out
        for depth, key in enumerate(keys[:-1]):
            prefix = keys[: depth + 1]
            child = node[key if isinstance(node, list) else str(key)]
            if prefix not in copied:
                child = _copy(child)
                node[key if isinstance(node, list) else str(key)] = child
                copied.add(prefix)
            node = child
        last = keys[-1]
        if value is _DROP:
            if isinstance(node, list):
                node[int(last)] = None
            else:
                node.pop(str(last), None)
        else:
            node[last if isinstance(node, list) else str(last)] = value
    return out


def _copy(node: Any) -> Any:
    if isinstance(node, Mapping):
        return dict(node)
    if isinstance(node, list):
        return list(node)
    return node


def find_sites(data: Any) -> list[tuple[Key, ...]]:
    """Key paths of every string holding ``${`` (for data that did not come from a parsed file)."""
    sites: list[tuple[Key, ...]] = []
    stack: list[tuple[tuple[Key, ...], Any]] = [((), data)]
    while stack:
        keys, node = stack.pop()
        if isinstance(node, str):
            if "${" in node:
                sites.append(keys)
        elif isinstance(node, Mapping):
            stack.extend(((*keys, str(k)), v) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend(((*keys, i), v) for i, v in enumerate(node))
    return sorted(sites, key=lambda k: [(0, x) if isinstance(x, int) else (1, x) for x in k])


def suggest_key(root: Any, dotted: str) -> str | None:
    """For a key path that does not exist in ``root``: the path with its first wrong component replaced
    by the closest existing key, and the keys that do exist there. None when there is nothing to say."""
    parts = dotted.split(".")
    node = root
    for i, part in enumerate(parts):
        keys = _child_keys(node)
        if keys is None:
            return None
        if part in keys:
            try:
                node = node[int(part)] if isinstance(node, list) else node[part]
            except Exception:  # an OmegaConf value that does not resolve: nothing to suggest below it
                return None
            continue
        match = closest(part, keys)
        parent = ".".join(parts[:i]) or "the config root"
        listed = f"{parent} has: {', '.join(sorted(keys))}" if keys else f"{parent} is empty"
        if match is None:
            return listed
        return f"did you mean {'.'.join([*parts[:i], match, *parts[i + 1 :]])!r}? {listed}"
    return None


def _child_keys(node: Any) -> list[str] | None:
    from omegaconf import DictConfig, ListConfig

    if isinstance(node, (Mapping, DictConfig)):
        return [str(k) for k in node.keys()]
    if isinstance(node, (list, ListConfig)):
        return [str(i) for i in range(len(node))]
    return None


__all__ = [
    "DROPPED",
    "InterpolationError",
    "Interpolator",
    "check_add",
    "check_mul",
    "find_sites",
    "register_resolvers",
    "resolve_sites",
    "suggest_key",
]
