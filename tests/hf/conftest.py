from __future__ import annotations

from pathlib import Path

import pytest

from tests.hf.tiny import make


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """``hf_dir(variant)``: that variant's tiny checkpoint, made once per session."""
    made: dict[str, Path] = {}

    def get(variant: str) -> Path:
        if variant not in made:
            made[variant] = make(variant, tmp_path_factory.mktemp(f"hf-{variant}"))
        return made[variant]

    return get
