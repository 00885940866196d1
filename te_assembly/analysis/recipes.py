"""Quantization recipes: YAML files that map field-for-field onto TE's recipe dataclasses.

A recipe file is a flat mapping: ``kind`` (the TE dataclass name, or ``none`` for plain BF16), ``name``,
``description`` and the dataclass fields by their TE names. Everything up to ``to_te_recipe`` is pure
Python: a bad recipe is reported without torch or Transformer Engine. The TE recipe object a recipe
becomes, and the hardware each kind needs, are the TE engine's (``engines/te/recipe.py``).

The schema below is written from ``transformer_engine/common/recipe/__init__.py`` (TE 2.20): field
names, types and defaults as TE declares them, and value choices from the docstrings and the
``__post_init__`` assertions, so that a value TE would reject is caught here with a key path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from te_assembly.config.locations import available_recipes, recipes_dir
from te_assembly.config.source import read_source
from te_assembly.diagnostics import Diagnostic, did_you_mean, error, has_errors, warning
from te_assembly.errors import ConfigError
from te_assembly.fields import FieldSpec, check_value, show

NO_QUANTIZATION = "none"
"""``kind`` of a recipe that runs in BF16 with no TE autocast recipe."""

META_KEYS = ("kind", "name", "description")

FORMAT_NAMES = ("E2M1", "E4M3", "E5M2", "HYBRID")
"""Members of TE's ``transformer_engine.common.recipe.Format`` enum, the only enum these dataclasses use."""

# TE asserts ``fp8_format != E5M2`` ("pure E5M2 training is not supported"), and E2M1 is an FP4 format.
_FP8_TRAINING_FORMATS = ("E4M3", "HYBRID")
# TE's _BACKWARD_OVERRIDES, minus None (null is allowed through ``nullable``).
_BACKWARD_OVERRIDES = ("high_precision", "dequantized")
# TE's _NVFP4_4OVER6_SCOPES and _NVFP4_4OVER6_ERR_MODES.
_NVFP4_4OVER6_SCOPES = ("none", "weights", "activations", "all")
_NVFP4_4OVER6_ERR_MODES = ("MAE", "MSE")


@dataclass(frozen=True)
class RecipeField(FieldSpec):
    """One YAML-settable field of a TE recipe dataclass: a ``fields.FieldSpec`` (checked like every
    config value) plus the TE enum its string names, if any. ``default`` is TE's default; an enum
    field's default is the member name (``"HYBRID"``)."""

    enum: str | None = None
    """Name of the TE enum in ``transformer_engine.common.recipe`` the value converts to."""


def _int(default: int, minimum: int) -> RecipeField:
    # TE does not range-check these; a bad one fails at the first forward.
    return RecipeField(int, default, minimum=minimum)


def _format(default: str, choices: tuple[str, ...] = _FP8_TRAINING_FORMATS) -> RecipeField:
    return RecipeField(str, default, choices=choices, enum="Format")


def _flag(default: bool = False) -> RecipeField:
    return RecipeField(bool, default)


def _backward_override(choices: tuple[str, ...] = _BACKWARD_OVERRIDES) -> RecipeField:
    # TE's default reads NVTE_BACKWARD_OVERRIDE at import; a shipped recipe writes null to pin it.
    return RecipeField(str, None, choices=choices, nullable=True)


RECIPE_SCHEMA: dict[str, dict[str, RecipeField]] = {
    "DelayedScaling": {
        "margin": _int(0, minimum=0),
        "fp8_format": _format("HYBRID"),
        "amax_history_len": _int(1024, minimum=1),
        "amax_compute_algo": RecipeField(str, "max", choices=("max", "most_recent")),
        "reduce_amax": _flag(True),
        "fp8_dpa": _flag(),
        "fp8_mha": _flag(),
        # TE asserts "Delayed scaling only supports backward_override=None".
        "backward_override": _backward_override(choices=()),
    },
    "Float8CurrentScaling": {
        "use_power_2_scales": _flag(),
        "fp8_format": _format("HYBRID"),
        "fp8_dpa": _flag(),
        "fp8_mha": _flag(),
        "backward_override": _backward_override(),
    },
    "MXFP8BlockScaling": {
        "margin": _int(0, minimum=0),
        "fp8_format": _format("E4M3"),
        "fp8_dpa": _flag(),
        "fp8_mha": _flag(),
        "backward_override": _backward_override(),
        "enable_2d_quantization": _flag(),
    },
    "Float8BlockScaling": {
        "use_f32_scales": _flag(),
        "fp8_format": _format("E4M3"),
        # TE asserts each block dimension is 1 or 2 (and no 2D-by-2D GEMM, see _block_dims_rule).
        "x_block_scaling_dim": RecipeField(int, 1, choices=(1, 2)),
        "w_block_scaling_dim": RecipeField(int, 2, choices=(1, 2)),
        "grad_block_scaling_dim": RecipeField(int, 1, choices=(1, 2)),
        # TE asserts "FP8 attention is not supported for Float8BlockScaling".
        "fp8_dpa": RecipeField(bool, False, choices=(False,)),
        "fp8_mha": RecipeField(bool, False, choices=(False,)),
        "backward_override": _backward_override(),
    },
    "NVFP4BlockScaling": {
        "disable_rht": _flag(),
        "disable_stochastic_rounding": _flag(),
        "disable_2d_quantization": _flag(),
        "row_scaled_activation": _flag(),
        "nvfp4_4over6": RecipeField(str, "none", choices=_NVFP4_4OVER6_SCOPES),
        "nvfp4_4over6_e4m3_use_256": RecipeField(str, "all", choices=_NVFP4_4OVER6_SCOPES),
        "nvfp4_4over6_err_mode": RecipeField(str, "MAE", choices=_NVFP4_4OVER6_ERR_MODES),
        # TE asserts "Only E2M1 is supported" / "Only E4M3 is supported" for NVFP4 scaling.
        "fp4_format": _format("E2M1", choices=("E2M1",)),
        "fp8_format": _format("E4M3", choices=("E4M3",)),
        "fp8_dpa": _flag(),
        "fp8_mha": _flag(),
        "backward_override": _backward_override(),
    },
}
"""kind -> field name -> spec, for every dataclass field a YAML file can express."""

_MMPARAMS_REASON = "takes a TE MMParams object (GEMM split-accumulator setting)"
SKIPPED_FIELDS: dict[str, dict[str, str]] = {
    "DelayedScaling": {"scaling_factor_compute_algo": "takes a Python callable"},
    "Float8CurrentScaling": {
        "fp8_gemm_fprop": _MMPARAMS_REASON,
        "fp8_gemm_dgrad": _MMPARAMS_REASON,
        "fp8_gemm_wgrad": _MMPARAMS_REASON,
    },
    "MXFP8BlockScaling": {},
    "Float8BlockScaling": {
        # TE asserts all three are True for block scaling, so there is nothing to choose anyway.
        "fp8_gemm_fprop": _MMPARAMS_REASON,
        "fp8_gemm_dgrad": _MMPARAMS_REASON,
        "fp8_gemm_wgrad": _MMPARAMS_REASON,
    },
    "NVFP4BlockScaling": {},
}
"""kind -> dataclass fields left out of the schema, with the reason (they are not plain YAML values)."""

RECIPE_KINDS: tuple[str, ...] = (NO_QUANTIZATION, *RECIPE_SCHEMA)


# ----------------------------------------------------------------------------------------------------
# Shipped files


def recipe_dir() -> Path:
    """The shipped recipes: ``_recipes`` inside an installed wheel, else the repo's ``recipes/``."""
    return recipes_dir()


def load_recipe(name: str) -> dict[str, Any]:
    """The shipped recipe ``name`` as plain data (not validated; see ``validate_recipe``)."""
    known = available_recipes()
    if name not in known:
        hint = did_you_mean(name, known) or f"available: {', '.join(known)}"
        raise ConfigError([error("recipe", "unknown-recipe", f"no shipped recipe named {name!r}", hint)])
    source = read_source(str(recipe_dir() / f"{name}.yaml"), "recipe")
    if not source.ok:
        raise ConfigError(list(source.diagnostics))
    if not isinstance(source.data, dict):
        diag = error("recipe", "wrong-type", f"expected a mapping, got {type(source.data).__name__}")
        raise ConfigError([diag.located(source.file, None)])
    return dict(source.data)


# ----------------------------------------------------------------------------------------------------
# Validation


def _check_key(kind: str, key: str, value: Any, prefix: str) -> list[Diagnostic]:
    path = f"{prefix}.{key}"
    spec = RECIPE_SCHEMA[kind].get(key)
    if spec is not None:
        return check_value(spec, value, path)
    skipped = SKIPPED_FIELDS[kind].get(key)
    if skipped is not None:
        return [error(path, "unsupported-key", f"{kind}.{key} cannot be set from YAML: it {skipped}")]
    hint = did_you_mean(key, [*RECIPE_SCHEMA[kind], *META_KEYS])
    return [error(path, "unknown-key", f"unknown key {key!r} in a {kind} recipe", hint)]


def _check_kind(cfg: Mapping[str, Any], prefix: str) -> list[Diagnostic]:
    path = f"{prefix}.kind"
    if "kind" not in cfg:
        hint = f"one of: {', '.join(RECIPE_KINDS)}"
        return [error(path, "missing-key", "missing required key 'kind'", hint)]
    kind = cfg["kind"]
    if kind in RECIPE_KINDS:
        return []
    hint = did_you_mean(kind, RECIPE_KINDS) or f"one of: {', '.join(RECIPE_KINDS)}"
    return [error(path, "unknown-recipe-kind", f"unknown recipe kind {show(kind)}", hint)]


def _check_meta(cfg: Mapping[str, Any], prefix: str) -> list[Diagnostic]:
    out = []
    for key in ("name", "description"):
        out.extend(check_value(_META, cfg.get(key), f"{prefix}.{key}"))
    return out


_META = FieldSpec(str, None, nullable=True)


def _block_dims_rule(cfg: Mapping[str, Any], prefix: str) -> list[Diagnostic]:
    """TE asserts no GEMM pairs two 2D-blocked operands (x*w in fprop, x*grad and w*grad in backward)."""
    schema = RECIPE_SCHEMA["Float8BlockScaling"]
    dims = {key: cfg.get(key, schema[key].default) for key in schema if key.endswith("_block_scaling_dim")}
    two_d = [key for key, value in dims.items() if value == 2]
    if len(two_d) < 2:
        return []
    message = f"{' and '.join(two_d)} are both 2; TE does not support a 2D-by-2D block GEMM"
    return [error(f"{prefix}.{two_d[-1]}", "recipe-constraint", message)]


def _f32_scales_rule(cfg: Mapping[str, Any], prefix: str) -> list[Diagnostic]:
    # TE derives the block quantizers' power-of-2 setting (fp8_quant_* class attributes) from
    # NVTE_FP8_BLOCK_SCALING_FP32_SCALES when the class is defined, not from this field.
    if cfg.get("use_f32_scales") is not True:
        return []
    message = "TE 2.20 ignores this field for quantization; power-of-2 scales stay on"
    hint = "set NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1 before importing transformer_engine"
    return [warning(f"{prefix}.use_f32_scales", "ineffective-field", message, hint)]


_CROSS_FIELD_RULES: dict[str, list[Callable[[Mapping[str, Any], str], list[Diagnostic]]]] = {
    "Float8BlockScaling": [_block_dims_rule, _f32_scales_rule],
}


def validate_recipe(cfg: Mapping[str, Any], prefix: str = "recipe") -> list[Diagnostic]:
    """Every problem in a recipe config at once, with key paths such as ``recipe.fp8_format``."""
    if not isinstance(cfg, Mapping):
        return [error(prefix, "wrong-type", f"expected a mapping, got {type(cfg).__name__}")]
    out = _check_kind(cfg, prefix) + _check_meta(cfg, prefix)
    kind = cfg.get("kind")
    if kind == NO_QUANTIZATION:
        out.extend(_no_fields_allowed(cfg, prefix))
    elif isinstance(kind, str) and kind in RECIPE_SCHEMA:
        out.extend(_check_fields(kind, cfg, prefix))
    # An unknown kind has no field list to check the other keys against; its error says so.
    return out


def _no_fields_allowed(cfg: Mapping[str, Any], prefix: str) -> list[Diagnostic]:
    message = f"kind {NO_QUANTIZATION!r} (no quantization) takes no fields"
    return [error(f"{prefix}.{key}", "unknown-key", message) for key in cfg if key not in META_KEYS]


def _check_fields(kind: str, cfg: Mapping[str, Any], prefix: str) -> list[Diagnostic]:
    out = []
    for key, value in cfg.items():
        if key not in META_KEYS:
            out.extend(_check_key(kind, str(key), value, prefix))
    if not has_errors(out):
        for rule in _CROSS_FIELD_RULES.get(kind, []):
            out.extend(rule(cfg, prefix))
    return out


# ----------------------------------------------------------------------------------------------------
# Building the TE object


class Recipe(Mapping[str, Any]):
    """A recipe config that passed ``validate_recipe``: read-only, its ``kind`` known. Building the TE
    recipe and the hardware checks take it as it is; a plain mapping is validated first (once)."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = dict(data)
        self.kind = str(self._data["kind"])

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"Recipe({self._data!r})"

    @property
    def name(self) -> str:
        return str(self._data.get("name") or self.kind)


def checked_recipe(cfg: Mapping[str, Any]) -> Recipe:
    """``cfg`` as a ``Recipe``, or ``ConfigError`` listing every problem."""
    if isinstance(cfg, Recipe):
        return cfg
    diagnostics = validate_recipe(cfg)
    if has_errors(diagnostics):
        raise ConfigError(diagnostics, summary="invalid quantization recipe")
    return Recipe(cfg)
