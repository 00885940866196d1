"""The language-model guide's Python snippet (docs/guides/language-models.md) runs as written from a user's
own folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.docs_text import block_after

REPO_ROOT = Path(__file__).resolve().parents[2]


def _snippet() -> str:
    return block_after("guides/language-models.md", "# Language models")


def test_the_language_model_snippet_trains_evaluates_and_generates(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TE_ASSEMBLY_CACHE", str(tmp_path / "cache"))
    (tmp_path / "notes").mkdir()
    for i in range(5):
        (tmp_path / "notes" / f"{i}.txt").write_text(f"The note {i} says: " + "the cat sat on the mat. " * 40)
    namespace: dict[str, Any] = {}
    exec(compile(_snippet(), "language-models.md", "exec"), namespace)
    trained, out = namespace["trained"], namespace["out"]
    assert [s for s, _ in trained.evaluations] == [10, 20, 30]
    assert trained.evaluations[-1][1]["val_loss"] < trained.evaluations[0][1]["val_loss"]
    assert len(out.ids) == 40 or out.stopped_at_eot
    assert (tmp_path / "runs" / "lm" / "ckpt-0000030.safetensors").is_file()
