"""The text of the README and the docs, for the tests that run what they show: a fenced block after a
heading or marker, and the yaml blocks that name a file."""

from __future__ import annotations

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def doc(path: str) -> str:
    """``README.md`` or a file under ``docs/`` (``"guides/python-api.md"``)."""
    return (REPO_ROOT / (path if path == "README.md" else f"docs/{path}")).read_text()


def block_after(path: str, marker: str, language: str = "python") -> str:
    """The first fenced ``language`` block after ``marker`` in ``path``."""
    text = doc(path)
    assert marker in text, f"{path} has no {marker!r}"
    found = re.search(rf"```{language}\n(.*?)```", text[text.index(marker) :], flags=re.S)
    assert found, f"no {language} block after {marker!r} in {path}"
    return found.group(1)


def blocks(path: str, language: str = "yaml") -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", doc(path), flags=re.S)
