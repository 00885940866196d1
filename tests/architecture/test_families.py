"""A Hugging Face family is one unit: no module outside ``te_assembly/formats/hf/families/`` names a
family (its ``architectures`` entry or ``model_type`` as a string in code, docstrings and comments
aside), and each family's class is in its own file, registered once."""

from __future__ import annotations

import ast
from pathlib import Path

from te_assembly.formats.hf.families import FAMILIES, REGISTRY

PACKAGE = Path(__file__).resolve().parents[2] / "te_assembly"
FAMILY_DIR = PACKAGE / "formats" / "hf" / "families"


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """The string constants of ``path`` that are not docstrings."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    # a string right after an assignment documents it (this project's attribute docstrings)
    docstrings |= {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_module_outside_the_families_names_one() -> None:
    names = {f.architecture for f in REGISTRY} | {f.model_type for f in REGISTRY}
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {value!r}"
        for path in PACKAGE.rglob("*.py")
        if FAMILY_DIR not in path.parents
        for line, value in _code_strings(path)
        if value in names
    ]
    assert not found, "a family named outside its file:\n" + "\n".join(found)


def test_each_family_is_its_own_file_registered_once() -> None:
    files = [Path(type(f).__module__.replace(".", "/") + ".py").name for f in REGISTRY]
    assert len(set(files)) == len(files) == len(FAMILIES)
    for family in REGISTRY:
        source = (FAMILY_DIR / Path(type(family).__module__.split(".")[-1] + ".py")).read_text()
        assert f"class {type(family).__name__}(" in source
        assert f'architecture = "{family.architecture}"' in source


def test_the_check_sees_a_family_named_elsewhere(tmp_path: Path) -> None:
    """The scan finds a branch on a family's name in code, and passes over one in a docstring."""
    planted = tmp_path / "planted.py"
    planted.write_text('"""Llama is LlamaForCausalLM."""\n\nif name == "LlamaForCausalLM":\n    pass\n')
    assert [value for _, value in _code_strings(planted)] == ["LlamaForCausalLM"]
