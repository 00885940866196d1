"""The docs stay true to the code: the generated reference pages are what ``scripts/gen_reference.py``
makes from the code today, every link between the pages resolves, the README stays the first five
minutes (at most ~300 lines), and what it shows runs from a user's own directory."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.docs_text import REPO_ROOT, block_after, blocks

DOCS = REPO_ROOT / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_reference", REPO_ROOT / "scripts" / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_reference"] = module
    spec.loader.exec_module(module)
    return module


def test_the_reference_pages_are_generated_from_the_code_as_it_is() -> None:
    generator = _generator()
    stale = generator.stale(generator.generate())
    assert not stale, f"stale: {stale}; run python scripts/gen_reference.py"


def test_the_generator_notices_a_stale_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    generator = _generator()
    monkeypatch.setattr(generator, "REFERENCE", tmp_path)
    (tmp_path / "ops.md").write_text("old\n")
    assert generator.stale({"ops.md": "new\n", "settings.md": "x\n"}) == ["ops.md", "settings.md"]


def _pages() -> list[Path]:
    return [REPO_ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_link_resolves(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # links in code are not links
    broken = []
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://", "#", "mailto:")):
            continue
        path = target.split("#", 1)[0]
        if not (page.parent / path).resolve().exists():
            broken.append(target)
    assert not broken, broken


def test_the_readme_is_the_first_five_minutes() -> None:
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, len(lines)
    text = "\n".join(lines)
    for guide in ("command-line", "configs-and-blocks", "training", "language-models", "hugging-face"):
        assert f"docs/guides/{guide}.md" in text, guide


def test_the_readme_model_file_validates() -> None:
    from te_assembly.analysis.pipeline import load

    (model,) = [b for b in blocks("README.md") if b.startswith("name: ")]
    plan = load(yaml.safe_load(model)).checked_plan()
    assert plan.channels["residual"].consumers  # the hidden residual is consumed


def test_the_readme_python_runs_from_another_directory(
    monkeypatch: pytest.MonkeyPatch, capsys: Any, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    exec(compile(block_after("README.md", "## From Python"), "README.md", "exec"), namespace)
    assert set(namespace["extras"]) == {"aux_loss"}
    assert namespace["result"].loss > 0 and len(namespace["trained"].losses) == 20
    printed = capsys.readouterr().out
    assert "steps" in printed and f"run loss {namespace['result'].loss:.4g}" in printed
    assert (tmp_path / "runs" / "mlp" / "loss_curve.png").is_file()  # te_assembly.train draws it
