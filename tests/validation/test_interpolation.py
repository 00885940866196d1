"""Interpolations: a missing key is one diagnostic at each place it is used, with a did-you-mean over
the keys that exist, and raw mappings from Python resolve ``${model.dims.X}`` as loaded files do."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from te_assembly.analysis.pipeline import load, validate_model
from te_assembly.config import configs_dir
from te_assembly.diagnostics import Diagnostic
from te_assembly.errors import ConfigError

MISSPELT = """\
name: misspelt
in_features: ${model.dims.hiden}
dims: {hidden: 8, ffn: 16}
ops:
  - name: norm
    op: LayerNorm
    args: {normalized_shape: "${model.dims.hiden}"}
  - name: fc
    op: Linear
    args: ${model.dims.fc_args}
  - name: act
    op: ${model.dims.kind}
  - name: out
    op: Linear
    args: {in_features: 8, out_features: "${mul:2,${model.dims.fn}}"}
"""
UNRESOLVED = {
    "model.in_features": "'model.dims.hidden'",
    "model.ops[0].args.normalized_shape": "'model.dims.hidden'",
    "model.ops[1].args": None,  # nothing close to fc_args: the hint lists what exists
    "model.ops[2].op": None,
    "model.ops[3].args.out_features": "'model.dims.ffn'",
}


def _check_only_unresolved(diags: list[Diagnostic]) -> None:
    errors = [d for d in diags if d.is_error]
    shown = "\n".join(d.format() for d in errors)
    # No "missing required key", "needs argument" or "exactly one of op or module" for absent values.
    assert {d.code for d in errors} == {"bad-interpolation"}, shown
    assert sorted(d.path for d in errors) == sorted(UNRESOLVED), shown
    for d in errors:
        wanted = UNRESOLVED[d.path]
        assert d.hint is not None, shown
        assert "model.dims has: ffn, hidden" in d.hint, shown
        if wanted is not None:
            assert f"did you mean {wanted}?" in d.hint, shown
        else:
            assert "did you mean" not in d.hint, shown


def test_missing_interpolation_in_a_file_is_reported_once_per_use(tmp_path: Path) -> None:
    path = tmp_path / "misspelt.yaml"
    path.write_text(MISSPELT)
    analysis = load(path)
    merged = list(analysis.diagnostics)
    assert analysis.plan is None
    _check_only_unresolved(merged)
    assert all(d.file == str(path) and d.line is not None for d in merged)


def test_missing_interpolation_in_a_raw_mapping() -> None:
    _check_only_unresolved(validate_model(yaml.safe_load(MISSPELT)))
    with pytest.raises(ConfigError) as caught:
        load(yaml.safe_load(MISSPELT)).checked_plan()
    _check_only_unresolved(caught.value.diagnostics)


@pytest.mark.parametrize("name", ["residual_mlp", "moe_block"])
def test_raw_mapping_resolves_like_a_composed_config(name: str) -> None:
    raw = yaml.safe_load((configs_dir() / "model" / f"{name}.yaml").read_text())
    assert validate_model(raw) == []
    plan = load(raw).checked_plan()
    composed = load(name).checked_plan()
    assert plan.in_features == composed.in_features
    assert [(s.name, s.args) for s in plan.steps] == [(s.name, s.args) for s in composed.steps]


def test_raw_mapping_is_not_modified() -> None:
    raw = yaml.safe_load((configs_dir() / "model" / "residual_mlp.yaml").read_text())
    before = copy.deepcopy(raw)
    load(raw).checked_plan()
    assert raw == before


def test_a_model_file_loaded_with_omegaconf_builds_a_plan() -> None:
    from omegaconf import OmegaConf

    path = configs_dir() / "model" / "residual_mlp.yaml"
    plan = load(OmegaConf.load(path)).checked_plan()
    assert plan.in_features == OmegaConf.load(path).dims.hidden
    assert plan.steps[2].args["out_features"] == 2 * OmegaConf.load(path).dims.ffn
