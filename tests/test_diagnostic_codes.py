"""The diagnostics table (``te_assembly/diagnostic_codes.py``) is the codes the source reports: each code
a literal in a diagnostic's code position is declared there, and each declared code is reported
somewhere. Read from the source (an AST walk), so a new rule cannot ship without its line in the table
and the reference."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from te_assembly.diagnostic_codes import CODES

PACKAGE = Path(__file__).resolve().parents[1] / "te_assembly"

# Where a code is given: (function name, index of the positional argument that is the code).
CODE_ARGUMENT = {"error": 1, "warning": 1, "Diagnostic": 3, "problem": 1, "fail": 0}


def _literal(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _codes_in(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            index = CODE_ARGUMENT.get(name)
            if index is not None and len(node.args) > index and (code := _literal(node.args[index])):
                yield code
            for keyword in node.keywords:
                if keyword.arg == "code" and (code := _literal(keyword.value)):
                    yield code
        elif isinstance(node, ast.Tuple):  # tables of (key, code, ...) rows, e.g. engines/choice.py
            for element in node.elts:
                text = _literal(element)
                if text is not None and text.startswith("bad-") and text in CODES:
                    yield text
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = node.args.args[len(node.args.args) - len(node.args.defaults) :]
            for param, default in zip(params, node.args.defaults, strict=True):
                if param.arg == "code" and (code := _literal(default)):
                    yield code


def reported_codes() -> dict[str, list[str]]:
    """Code -> the files that report it."""
    out: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for code in _codes_in(ast.parse(path.read_text())):
            out.setdefault(code, []).append(str(path.relative_to(PACKAGE.parent)))
    return out


def test_every_reported_code_is_declared() -> None:
    undeclared = {code: files for code, files in reported_codes().items() if code not in CODES}
    assert not undeclared, f"declare these in te_assembly/diagnostic_codes.py: {undeclared}"


def test_every_declared_code_is_reported() -> None:
    stale = sorted(set(CODES) - set(reported_codes()))
    assert not stale, f"nothing reports these codes any more: {stale}"


def test_the_scan_finds_codes_in_every_position() -> None:
    """A code as ``error``'s second argument, as ``code=``, and as a parameter's default is found."""
    source = (
        "error('p', 'dangling-input', 'm')\n"
        "r.refuse('k', 'm', code='hf-bad-value')\n"
        "def refuse(self, key, message, code='hf-unsupported'): pass\n"
        "Diagnostic(Severity.ERROR, 'p', 'm', 'yaml-tag')\n"
    )
    assert set(_codes_in(ast.parse(source))) == {
        "dangling-input",
        "hf-bad-value",
        "hf-unsupported",
        "yaml-tag",
    }
