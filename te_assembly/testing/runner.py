"""What each of the plugin's items does (``plugin.py`` collects them): one call of ``checks.py`` per
item, chosen by the item's kind."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from te_assembly.errors import ConfigCheckError, SidecarError
from te_assembly.testing import checks


def _validate(config: Any, folder: Path, sidecar: Any, overrides: tuple[str, ...]) -> None:
    if sidecar.diagnostics is not None:
        checks.assert_diagnostics(config, sidecar.diagnostics, overrides, [folder])
    else:
        checks.assert_valid(config, overrides, [folder])


def _with_recipe(recipe: Path, folder: Path, model: Path) -> None:
    """The model validates with the recipe. A model that is invalid on its own is its own item's
    failure (reported there, once): this item then checks only what the recipe adds, and is skipped
    (saying so) when the recipe adds nothing."""
    alone = [d for d in checks.analyze(model, (), [folder]).diagnostics if d.is_error]
    if not alone:
        checks.assert_valid(model, [f"recipe={recipe.resolve()}"], [folder])
        return
    found = checks.analyze(model, [f"recipe={recipe.resolve()}"], [folder]).diagnostics
    known = {(d.code, d.path) for d in alone}
    added = [d for d in found if d.is_error and (d.code, d.path) not in known]
    if added:
        text = [
            f"{model.name} with recipe {recipe.name}: {len(added)} error(s) the recipe adds",
            *checks.diagnostic_lines(added),
        ]
        raise ConfigCheckError("\n".join(text))
    pytest.skip(
        f"{model.name} is itself invalid (its own validate item reports it); the recipe adds no error"
    )


def run_check(path: Path, check: tuple[Any, ...]) -> None:
    kind = check[0]
    if kind == "sidecar":
        raise SidecarError(check[1])
    if kind == "refused":
        raise ConfigCheckError(check[1])
    if kind == "model":
        _, folder, sidecar, overrides = check
        _validate(path, folder, sidecar, overrides)
    elif kind == "block":
        _, folder, sidecar, overrides = check
        model = checks.block_model(str(path.resolve()), path, sidecar.model)
        model["name"] = f"{path.stem}_check"
        if not overrides:
            _validate(model, folder, sidecar, overrides)
            return
        # Overrides such as recipe=... need a composed config, so the model goes through a file.
        with tempfile.TemporaryDirectory(prefix="te_assembly-block-") as tmp:
            file = Path(tmp) / f"{path.stem}_check.yaml"
            file.write_text(yaml.safe_dump(model, sort_keys=False))
            _validate(file, folder, sidecar, overrides)
    elif kind == "recipe":
        _, _folder, sidecar, _ = check
        checks.assert_recipe(path, sidecar.diagnostics)
    elif kind == "with":
        _, folder, model = check
        _with_recipe(path, folder, model)
    elif kind == "build":
        checks.build_on_meta(checks.assert_valid(path, (), [check[1]]))
    elif kind == "smoke":
        checks.smoke(checks.assert_valid(path, (), [check[1]]))
    elif kind == "te":
        from te_assembly.engines import te_available

        if not te_available():
            pytest.skip("Transformer Engine does not import here (pip install 'te_assembly[te]')")
        checks.build_with_te(checks.assert_valid(path, (), [check[1]]))
    elif kind == "fits":
        _, folder, target = check
        analysis = checks.assert_valid(path, (), [folder], checks.sections_with_train())
        checks.assert_fits(analysis, target)
    else:  # pragma: no cover - the plugin makes only the kinds above
        raise AssertionError(f"unknown config check {kind!r}")
