"""Quantization recipes: shipped YAML, validation without TE, the TE mapping and the hardware rules."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from te_assembly.analysis.recipes import (
    META_KEYS,
    NO_QUANTIZATION,
    RECIPE_SCHEMA,
    SKIPPED_FIELDS,
    available_recipes,
    load_recipe,
    recipe_dir,
    validate_recipe,
)
from te_assembly.diagnostics import Diagnostic
from te_assembly.engines.te.recipe import check_recipe_supported, required_capability, to_te_recipe
from te_assembly.errors import ConfigError, UnsupportedRecipeError

RECIPE_FILES = sorted(recipe_dir().glob("*.yaml"))

# TE reads these at import to pick some dataclass defaults; with any of them set, TE's defaults are not
# the documented ones our schema records.
_DEFAULT_CHANGING_ENV = (
    "NVTE_BACKWARD_OVERRIDE",
    "NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES",
    "NVTE_FP8_BLOCK_SCALING_FP32_SCALES",
    "NVTE_NVFP4_DISABLE_RHT",
    "NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING",
    "NVTE_NVFP4_DISABLE_2D_QUANTIZATION",
    "NVTE_NVFP4_ROW_SCALED_ACTIVATION",
    "NVTE_NVFP4_4OVER6",
    "NVTE_NVFP4_4OVER6_E4M3_USE_256",
    "NVTE_NVFP4_4OVER6_ERR_MODE",
)


def _errors(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    return [d for d in diagnostics if d.is_error]


def _only_error(diagnostics: list[Diagnostic]) -> Diagnostic:
    errors = _errors(diagnostics)
    assert len(errors) == 1, [d.format() for d in diagnostics]
    return errors[0]


@pytest.fixture  # function scope: the autouse te-tier check (tests/conftest.py) must run first
def te_recipe() -> ModuleType:
    try:
        # TE's core library needs torch loaded first on this setup.
        import torch  # noqa: F401
        import transformer_engine.common.recipe as module
    except (ImportError, OSError) as exc:
        pytest.skip(f"transformer_engine.common.recipe cannot be imported: {exc}")
    return module


# ----------------------------------------------------------------------------------------------------
# Shipped files


def test_recipe_dir_has_all_issue_recipes() -> None:
    expected = {"bf16", "fp8_delayed", "fp8_current", "mxfp8", "fp8_block", "nvfp4"}
    assert expected <= set(available_recipes())


@pytest.mark.parametrize("path", RECIPE_FILES, ids=lambda p: p.stem)
def test_shipped_recipe_validates_cleanly(path: Path) -> None:
    cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert validate_recipe(cfg) == []
    assert cfg["name"] == path.stem
    assert isinstance(cfg["description"], str) and cfg["description"]


@pytest.mark.parametrize("path", RECIPE_FILES, ids=lambda p: p.stem)
def test_shipped_recipe_writes_out_every_field(path: Path) -> None:
    cfg = load_recipe(path.stem)
    fields = set(cfg) - set(META_KEYS)
    assert fields == set(RECIPE_SCHEMA.get(cfg["kind"], {}))


def test_load_unknown_recipe_suggests_name() -> None:
    with pytest.raises(ConfigError) as info:
        load_recipe("mxfp")
    assert "mxfp8" in (info.value.diagnostics[0].hint or "")


# ----------------------------------------------------------------------------------------------------
# Validation without TE


def test_unknown_field_has_path_and_suggestion() -> None:
    cfg = {**load_recipe("fp8_delayed"), "amax_histroy_len": 16}
    diag = _only_error(validate_recipe(cfg))
    assert diag.path == "recipe.amax_histroy_len"
    assert diag.code == "unknown-key"
    assert "amax_history_len" in (diag.hint or "")


def test_bad_enum_lists_allowed_values_and_suggestion() -> None:
    cfg = {**load_recipe("fp8_delayed"), "fp8_format": "HYBRD"}
    diag = _only_error(validate_recipe(cfg))
    assert diag.path == "recipe.fp8_format"
    assert diag.code == "bad-choice"
    assert "E4M3" in diag.message and "HYBRID" in diag.message
    assert "HYBRID" in (diag.hint or "")


def test_enum_value_te_would_refuse_is_caught() -> None:
    cfg = {**load_recipe("nvfp4"), "fp8_format": "HYBRID"}
    assert _only_error(validate_recipe(cfg)).path == "recipe.fp8_format"


def test_unknown_kind_suggests_kind() -> None:
    diag = _only_error(validate_recipe({"kind": "MXFP8BlockScalling"}))
    assert diag.path == "recipe.kind"
    assert diag.code == "unknown-recipe-kind"
    assert "MXFP8BlockScaling" in (diag.hint or "")


def test_missing_kind() -> None:
    assert _only_error(validate_recipe({"name": "x"})).path == "recipe.kind"


def test_string_for_int_is_wrong_type() -> None:
    cfg = {**load_recipe("fp8_delayed"), "amax_history_len": "16"}
    diag = _only_error(validate_recipe(cfg))
    assert (diag.path, diag.code) == ("recipe.amax_history_len", "wrong-type")


def test_bool_is_not_an_int() -> None:
    cfg = {**load_recipe("mxfp8"), "margin": True}
    assert _only_error(validate_recipe(cfg)).code == "wrong-type"


def test_all_errors_reported_at_once_with_custom_prefix() -> None:
    cfg = {**load_recipe("fp8_delayed"), "amax_histroy_len": 16, "fp8_format": "HYBRD", "margin": "0"}
    paths = {d.path for d in _errors(validate_recipe(cfg, prefix="train.recipe"))}
    assert paths == {"train.recipe.amax_histroy_len", "train.recipe.fp8_format", "train.recipe.margin"}


def test_object_valued_te_field_is_refused_with_reason() -> None:
    cfg = {**load_recipe("fp8_current"), "fp8_gemm_fprop": {"use_split_accumulator": True}}
    diag = _only_error(validate_recipe(cfg))
    assert diag.code == "unsupported-key" and "MMParams" in diag.message


def test_backward_override_null_only_for_delayed_scaling() -> None:
    diag = _only_error(validate_recipe({**load_recipe("fp8_delayed"), "backward_override": "dequantized"}))
    assert diag.path == "recipe.backward_override"
    assert validate_recipe({**load_recipe("fp8_current"), "backward_override": "dequantized"}) == []


def test_block_scaling_rejects_2d_by_2d() -> None:
    cfg = {**load_recipe("fp8_block"), "x_block_scaling_dim": 2}
    assert _only_error(validate_recipe(cfg)).code == "recipe-constraint"


def test_block_scaling_f32_scales_warns() -> None:
    diagnostics = validate_recipe({**load_recipe("fp8_block"), "use_f32_scales": True})
    assert [d.code for d in diagnostics] == ["ineffective-field"] and not _errors(diagnostics)


def test_kind_none_takes_no_fields() -> None:
    diag = _only_error(validate_recipe({"kind": NO_QUANTIZATION, "margin": 0}))
    assert diag.path == "recipe.margin"


def test_override_merged_with_omegaconf_validates() -> None:
    omegaconf = pytest.importorskip("omegaconf")
    base = omegaconf.OmegaConf.create(load_recipe("fp8_delayed"))
    merged = omegaconf.OmegaConf.merge(base, omegaconf.OmegaConf.from_dotlist(["amax_history_len=16"]))
    assert validate_recipe(merged) == []
    assert merged.amax_history_len == 16


def test_to_te_recipe_raises_config_error_before_importing_te() -> None:
    with pytest.raises(ConfigError) as info:
        to_te_recipe({"kind": "DelayedScaling", "fp8_format": "HYBRD"})
    assert info.value.diagnostics[0].path == "recipe.fp8_format"


def test_import_does_not_pull_in_torch_or_te() -> None:
    code = (
        "import sys, te_assembly.analysis.recipes as r; r.validate_recipe(r.load_recipe('mxfp8'));"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformer_engine')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert result.returncode == 0, result.stdout + result.stderr


# ----------------------------------------------------------------------------------------------------
# Against TE's dataclasses


def _te_default(field: dataclasses.Field[Any]) -> Any:
    value = field.default
    return value.name if hasattr(value, "name") and hasattr(value, "value") else value


@pytest.mark.te
@pytest.mark.parametrize("kind", sorted(RECIPE_SCHEMA))
def test_schema_matches_te_dataclass(kind: str, te_recipe: ModuleType) -> None:
    changed = [name for name in _DEFAULT_CHANGING_ENV if name in os.environ]
    if changed:
        pytest.skip(f"{', '.join(changed)} set: TE's defaults differ from the documented ones")
    te_fields = {f.name: f for f in dataclasses.fields(getattr(te_recipe, kind))}
    assert set(RECIPE_SCHEMA[kind]) | set(SKIPPED_FIELDS[kind]) == set(te_fields)
    assert not set(RECIPE_SCHEMA[kind]) & set(SKIPPED_FIELDS[kind])
    for name, spec in RECIPE_SCHEMA[kind].items():
        assert spec.default == _te_default(te_fields[name]), name
        if spec.enum is not None:
            members = {m.name for m in getattr(te_recipe, spec.enum)}
            assert set(spec.choices or ()) <= members, name


@pytest.mark.te
def test_format_names_match_te(te_recipe: ModuleType) -> None:
    from te_assembly.analysis.recipes import FORMAT_NAMES

    assert set(FORMAT_NAMES) == {m.name for m in te_recipe.Format}


@pytest.mark.te
@pytest.mark.parametrize("path", RECIPE_FILES, ids=lambda p: p.stem)
def test_to_te_recipe_builds_te_object(path: Path, te_recipe: ModuleType) -> None:
    cfg = load_recipe(path.stem)
    obj = to_te_recipe(cfg)
    if cfg["kind"] == NO_QUANTIZATION:
        assert obj is None
        return
    assert type(obj) is getattr(te_recipe, cfg["kind"])
    for key, spec in RECIPE_SCHEMA[cfg["kind"]].items():
        value = getattr(obj, key)
        if spec.enum is not None:
            assert isinstance(value, getattr(te_recipe, spec.enum)), key
            value = value.name
        assert value == cfg[key], key


@pytest.mark.te
def test_to_te_recipe_applies_override(te_recipe: ModuleType) -> None:
    obj = to_te_recipe({**load_recipe("fp8_delayed"), "amax_history_len": 16, "fp8_format": "E4M3"})
    assert isinstance(obj, te_recipe.DelayedScaling)
    assert obj.amax_history_len == 16
    assert obj.fp8_format is te_recipe.Format.E4M3


# ----------------------------------------------------------------------------------------------------
# Hardware rules


def test_mxfp8_refused_on_hopper() -> None:
    with pytest.raises(UnsupportedRecipeError) as info:
        check_recipe_supported(load_recipe("mxfp8"), (9, 0), "12.9")
    message = str(info.value)
    assert "10" in message and "9.0" in message and "'mxfp8'" in message and "MXFP8BlockScaling" in message


def test_mxfp8_refused_on_sm120_like_te() -> None:
    with pytest.raises(UnsupportedRecipeError):
        check_recipe_supported(load_recipe("mxfp8"), (12, 0), "12.9")
    check_recipe_supported(load_recipe("mxfp8"), (10, 0), "12.9")


def test_fp8_delayed_capability() -> None:
    cfg = load_recipe("fp8_delayed")
    check_recipe_supported(cfg, (9, 0), "12.4")
    check_recipe_supported(cfg, (8, 9), "12.1")
    with pytest.raises(UnsupportedRecipeError, match=r"8.0"):
        check_recipe_supported(cfg, (8, 0), "12.4")
    with pytest.raises(UnsupportedRecipeError, match=r"12.1"):
        check_recipe_supported(cfg, (8, 9), "12.0")


def test_fp8_block_needs_cuda_12_9() -> None:
    cfg = load_recipe("fp8_block")
    check_recipe_supported(cfg, (9, 0), "12.9")
    check_recipe_supported(cfg, (10, 0), "13.0")
    with pytest.raises(UnsupportedRecipeError, match=r"12.9"):
        check_recipe_supported(cfg, (9, 0), "12.8")
    with pytest.raises(UnsupportedRecipeError, match=r"12.9"):
        check_recipe_supported(cfg, (9, 0), None)
    with pytest.raises(UnsupportedRecipeError, match=r"8.9"):
        check_recipe_supported(cfg, (8, 9), "12.9")


def test_nvfp4_and_bf16_capability() -> None:
    with pytest.raises(UnsupportedRecipeError, match=r"10.0"):
        check_recipe_supported(load_recipe("nvfp4"), (9, 0), "12.9")
    check_recipe_supported(load_recipe("nvfp4"), (12, 0), "12.9")
    check_recipe_supported(load_recipe("bf16"), (7, 0), None)


def test_required_capability() -> None:
    assert required_capability(load_recipe("bf16")) is None
    minimum, text = required_capability(load_recipe("mxfp8")) or ((0, 0), "")
    assert minimum == (10, 0) and "MXFP8" in text and "10.x" in text
    assert (required_capability(load_recipe("fp8_delayed")) or ((0, 0), ""))[0] == (8, 9)


@pytest.mark.parametrize(
    ("name", "field", "value", "minimum"),
    [("fp8_delayed", "amax_history_len", 0, 1), ("fp8_delayed", "margin", -1, 0), ("mxfp8", "margin", -5, 0)],
)
def test_out_of_range_fields_are_config_errors(name: str, field: str, value: int, minimum: int) -> None:
    diag = _only_error(validate_recipe({**load_recipe(name), field: value}))
    assert (diag.path, diag.code) == (f"recipe.{field}", "out-of-range")
    wanted = "positive" if minimum == 1 else f">= {minimum}"
    assert diag.message == f"{field} must be {wanted}, got {value}"
    assert validate_recipe({**load_recipe(name), field: minimum}) == []
