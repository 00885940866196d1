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


def test_a_block_beside_the_model_file_is_pointed_to(tmp_path: Path) -> None:
    """DIR/model/m.yaml names block my_layer, which is in DIR/block/ but DIR is not on the search path:
    the hint names the folder to add, not an unrelated shipped block."""
    from te_assembly.analysis.pipeline import load

    (tmp_path / "model").mkdir()
    (tmp_path / "block").mkdir()
    (tmp_path / "block" / "my_layer.yaml").write_text(
        "name: my_layer\nops:\n  - name: s\n    op: ConstantScale\n    args: {scale: 2.0}\n"
    )
    model = tmp_path / "model" / "m.yaml"
    model.write_text("name: m\nin_features: 8\nops:\n  - name: layers\n    block: my_layer\n")
    found = [d for d in load(model).diagnostics if d.code == "unknown-block"]
    assert len(found) == 1 and found[0].hint is not None
    assert f"add -cd {tmp_path}" in found[0].hint and "moe_layer" not in found[0].hint
    assert load(model, config_dirs=[tmp_path]).plan is not None  # and with it, the model validates
