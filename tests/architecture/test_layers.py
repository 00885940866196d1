"""The package's layers import only downward, and no module imports itself round a cycle.

Read from the source (an AST walk of ``te_assembly/``), so every import counts: module level, inside
functions (the lazy imports that keep torch and TE out of ``validate``) and under ``TYPE_CHECKING``. The
layers are the ones docs/architecture.md describes; a module's layer is its folder."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "te_assembly"

FOUNDATION = (
    "collector",
    "diagnostics",
    "display",
    "errors",
    "fields",
    "files",
    "lazy",
    "sections",
    "version",
)
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", tuple(f"te_assembly.{name}" for name in FOUNDATION)),
    ("catalog", ("te_assembly.catalog",)),
    ("config", ("te_assembly.config",)),
    ("analysis", ("te_assembly.analysis",)),
    ("data", ("te_assembly.data",)),
    ("engines", ("te_assembly.engines",)),
    ("formats", ("te_assembly.formats",)),
    ("jobs", ("te_assembly.jobs",)),
    ("views", ("te_assembly.views",)),
    ("front ends", ("te_assembly.cli", "te_assembly.__main__", "te_assembly.testing")),
    ("api", ("te_assembly",)),
)
"""Lowest first. ``te_assembly`` itself (the package's ``__init__``: the public names, resolved on first
use) is the top."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int:
    best, depth = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and prefix.count(".") > depth:
                best, depth = index, prefix.count(".")
    assert best is not None, f"{module} is in no layer"
    return best


def _targets(node: ast.AST, module: str, is_package: bool, known: dict[str, Path]) -> Iterator[str]:
    """The te_assembly modules one import statement reads (``from pkg import mod`` reads ``pkg.mod``)."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] == "te_assembly":
                yield alias.name
        return
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - node.level + 1]
        source = ".".join([*base, *([node.module] if node.module else [])])
    else:
        source = node.module or ""
    if source.split(".")[0] != "te_assembly":
        return
    submodules = [f"{source}.{alias.name}" for alias in node.names if f"{source}.{alias.name}" in known]
    if len(submodules) < len(node.names):
        yield source
    yield from submodules


def imports(known: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module -> {imported module: line}."""
    out: dict[str, dict[str, int]] = {}
    for module, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        found: dict[str, int] = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(node, module, path.name == "__init__.py", known):
                    found.setdefault(target, node.lineno)
        out[module] = found
    return out


KNOWN = modules()
GRAPH = imports(KNOWN)


def test_every_module_has_a_layer() -> None:
    names = [LAYERS[layer_of(m)][0] for m in KNOWN]
    assert "foundation" in names and "jobs" in names


def test_layers_import_only_downward() -> None:
    upward = [
        f"{KNOWN[m].relative_to(PACKAGE.parent)}:{line}: {m} ({LAYERS[layer_of(m)][0]}) imports "
        f"{target} ({LAYERS[layer_of(target)][0]})"
        for m, targets in GRAPH.items()
        for target, line in targets.items()
        if target in KNOWN and layer_of(target) > layer_of(m)
    ]
    assert not upward, "\n".join(upward)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_no_import_cycle() -> None:
    graph = {m: {t for t in targets if t in KNOWN and t != m} for m, targets in GRAPH.items()}
    # A package's __init__ runs before any of its modules; an import of the package from inside it
    # is that order, not a cycle.
    graph = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


@pytest.mark.parametrize(
    ("module", "expected"),
    [("te_assembly.errors", "foundation"), ("te_assembly.analysis.plan", "analysis"), ("te_assembly", "api")],
)
def test_layer_of(module: str, expected: str) -> None:
    assert LAYERS[layer_of(module)][0] == expected


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The walk finds imports inside functions and under TYPE_CHECKING, where the lazy ones live."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from te_assembly.jobs import train\n"
        "def f():\n    from te_assembly.cli import main\n"
    )
    path = PACKAGE / "analysis" / "_probe.py"
    tree = ast.parse(source)
    found = {
        t
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for t in _targets(node, module_name(path), False, KNOWN)
    }
    assert {"te_assembly.jobs.train", "te_assembly.cli.main"} <= found
    assert all(layer_of(t) > layer_of("te_assembly.analysis._probe") for t in found)
