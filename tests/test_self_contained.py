"""The product refers to nothing outside its repository: no ``shared/`` folder, and every ``docs/`` file
it cites exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / p for p in out.splitlines() if (ROOT / p).is_file()]


def test_no_file_points_at_a_shared_folder() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in _tracked()
        if p.suffix in (".py", ".md", ".sh", ".yaml", ".toml", "")
        and re.search(r"\bshared/", p.read_text(errors="ignore"))
        and p.name != Path(__file__).name
    ]
    assert offenders == []


def test_every_cited_doc_exists() -> None:
    cited = {
        match
        for p in _tracked()
        if p.suffix in (".py", ".md", ".sh")
        for match in re.findall(r"\bdocs/([\w.-]+\.md)\b", p.read_text(errors="ignore"))
    }
    assert cited, "nothing cites docs/: this test would be vacuous"
    assert sorted(c for c in cited if not (ROOT / "docs" / c).is_file()) == []
