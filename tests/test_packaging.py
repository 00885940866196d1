"""A non-editable install must find the shipped configs and recipes (they live outside the package)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("hatchling", reason="building the wheel needs hatchling (the [dev] extra)")
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (found,) = out.glob("te_assembly-*.whl")
    return found


def test_wheel_ships_every_config_and_recipe(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder, target in (("configs", "te_assembly/_configs"), ("recipes", "te_assembly/_recipes")):
        for path in (ROOT / folder).rglob("*.yaml"):
            assert f"{target}/{path.relative_to(ROOT / folder).as_posix()}" in names


def test_installed_wheel_finds_configs_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    script = (
        "import te_assembly.config as c, te_assembly.analysis.recipes as r;"
        "print(c.configs_dir()); print(','.join(c.available_models()));"
        "print(','.join(r.available_recipes()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    configs_dir, models, recipes = done.stdout.strip().splitlines()
    assert configs_dir.startswith(str(site))
    assert set(models.split(",")) == {p.stem for p in (ROOT / "configs" / "model").glob("*.yaml")}
    assert set(recipes.split(",")) == {p.stem for p in (ROOT / "recipes").glob("*.yaml")}
