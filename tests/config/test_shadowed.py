"""A config name found in more than one config folder: only the first (Hydra's search-path order, shipped
first) is read, so the other is named in a warning instead of being ignored silently."""

from __future__ import annotations

from pathlib import Path

import te_assembly
from te_assembly.config import configs_dir
from te_assembly.config.locations import recipes_dir


def _copy(src: Path, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(src.read_text())
    return dest


def _shadow_warnings(analysis: te_assembly.Analysis) -> list[str]:
    return [d.message for d in analysis.diagnostics if d.code == "shadowed-config"]


def test_a_model_copied_under_its_shipped_name_is_named_in_a_warning(tmp_path: Path) -> None:
    mine = _copy(configs_dir() / "model" / "residual_mlp.yaml", tmp_path / "model" / "residual_mlp.yaml")
    analysis = te_assembly.load("residual_mlp", config_dirs=[tmp_path])
    [message] = _shadow_warnings(analysis)
    assert str(mine) in message and "residual_mlp" in message
    assert analysis.plan is not None  # a warning, not an error
    by_path = te_assembly.load(str(mine), config_dirs=[tmp_path])
    assert _shadow_warnings(by_path) == []


def test_a_recipe_and_a_block_are_checked_too(tmp_path: Path) -> None:
    recipe = next(p for p in sorted(recipes_dir().iterdir()) if p.suffix == ".yaml")
    _copy(recipe, tmp_path / "recipe" / recipe.name)
    _copy(configs_dir() / "block" / "dense_layer.yaml", tmp_path / "block" / "dense_layer.yaml")
    analysis = te_assembly.load(
        "dense_transformer", overrides=[f"recipe={recipe.stem}"], config_dirs=[tmp_path]
    )
    messages = _shadow_warnings(analysis)
    assert any(f"recipe {recipe.stem!r}" in m for m in messages)
    assert any("block 'dense_layer'" in m for m in messages)


def test_unique_names_give_no_warning(tmp_path: Path) -> None:
    _copy(configs_dir() / "model" / "residual_mlp.yaml", tmp_path / "model" / "my_mlp.yaml")
    assert _shadow_warnings(te_assembly.load("my_mlp", config_dirs=[tmp_path])) == []
    assert _shadow_warnings(te_assembly.load("moe_transformer", config_dirs=[tmp_path])) == []
