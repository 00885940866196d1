"""Shape rules of the quantization recipes: which model dimensions each recipe's GEMMs accept.

Pure Python (no torch, no TE), so ``validate`` reports a model that a recipe cannot run before any GPU
is touched. TE itself only finds out inside its kernels, with messages such as "Leading dimension
requirement on A for FP8 GEMM. Caller must pad." (``transformer_engine/common/gemm/cublaslt_gemm.cu``).

Where each number comes from (TE 2.20.2):

- Feature dimensions (``in_features``/``out_features`` of every TE GEMM op): TE's own op tests run a
  recipe only on shapes whose last dimension and product of leading dimensions are multiples of 16
  (FP8 per-tensor scaling, NVFP4), 32 (MXFP8) or 128 (FP8 block scaling), and skip every other shape
  as unsupported (``tests/pytorch/test_fusible_ops.py``, ``maybe_skip_quantization``). The FP8 GEMM
  asserts behind the 16: ``cublaslt_gemm.cu`` (``lda % 16``, ``ldb % 16``) and
  ``transformer_engine/pytorch/utils.py`` (``assert_dim_for_fp8_exec``). MXFP8 and NVFP4 scale blocks
  of 32 and 16 values along a row (``MXFP8Quantizer.is_quantizable``, ``NVFP4Quantizer.is_quantizable``).
- Rows of each expert group (``Dispatch``'s ``align``): the alignment TE pads each group of a grouped
  GEMM to, ``get_align_size_for_quantization`` in ``transformer_engine/pytorch/quantization.py``
  (16 for FP8, 32 for MXFP8, 128 for NVFP4; used by ``module/fp8_padding.py``). For FP8 block scaling
  that function says 16, but each group's rows are the M dimension of its GEMM and the K dimension of
  its weight-gradient GEMM, and TE's tests only run block-scaled GEMMs whose dimensions are all
  multiples of 128, so 128 is asked here: the rule TE's tests prove, not one they skip.
- Token rows reaching a non-grouped GEMM (``Linear``/``BasicLinear`` before any ``Dispatch``): the
  same multiple as the feature dimensions; known only at call time (``token_multiple``). For a model
  that takes ``[batch, seq, features]`` the rows are ``batch * seq``.
- ``Attention`` (a module) has no shape rule: it runs in the model's dtype, never in FP8. A recipe that
  asks for FP8 attention (``fp8_dpa`` or ``fp8_mha`` true) is refused for a model with attention: TE's
  DotProductAttention would quantize it, the reference engine would not, and nothing here measures what
  that costs. Its QKV and output projections are ordinary ``Linear`` steps, checked above.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from te_assembly.diagnostics import Diagnostic, error


class ShapeRule(NamedTuple):
    label: str
    """How messages name the recipe's kind of quantization."""
    dim_multiple: int
    """Every feature dimension of a quantized GEMM is a multiple of this."""
    group_align: int
    """Every expert group of a grouped GEMM has a multiple of this many rows."""


SHAPE_RULES: dict[str, ShapeRule] = {
    "DelayedScaling": ShapeRule("FP8 per-tensor scaling", 16, 16),
    "Float8CurrentScaling": ShapeRule("FP8 per-tensor scaling", 16, 16),
    "MXFP8BlockScaling": ShapeRule("MXFP8 block scaling", 32, 32),
    "Float8BlockScaling": ShapeRule("FP8 block scaling", 128, 128),
    "NVFP4BlockScaling": ShapeRule("NVFP4 block scaling", 16, 128),
}
"""Recipe kind -> its shape rule (sources in the module docstring). ``kind: none`` has no rule."""

GEMM_OPS: dict[str, tuple[str, ...]] = {
    "Linear": ("in_features", "out_features"),
    "BasicLinear": ("in_features", "out_features"),
    "GroupedLinear": ("in_features", "out_features"),
}
"""Catalog ops that TE runs as quantized GEMMs under a recipe, and their dimension arguments. Our own
ops (the router's scoring GEMM) run in plain torch and are never quantized."""

TOKEN_GEMM_OPS = ("Linear", "BasicLinear")
"""GEMM ops whose rows are the caller's tokens when they sit before any Dispatch."""


def shape_rule(recipe: Mapping[str, Any] | None) -> ShapeRule | None:
    """The rule of a recipe config, or None when it does not quantize (or its kind is unknown:
    ``validate_recipe`` reports that one)."""
    if not isinstance(recipe, Mapping):
        return None
    kind = recipe.get("kind")
    return SHAPE_RULES.get(kind) if isinstance(kind, str) else None


def _recipe_label(recipe: Mapping[str, Any], rule: ShapeRule) -> str:
    name = recipe.get("name") or recipe.get("kind")
    return f"recipe {name} ({rule.label})"


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _dimension_diagnostics(step: Any, recipe: Mapping[str, Any], rule: ShapeRule) -> list[Diagnostic]:
    out = []
    for arg in GEMM_OPS[step.type]:
        value = step.args.get(arg)
        if not _is_count(value) or value % rule.dim_multiple == 0:
            continue
        message = (
            f"{arg}={value} is not a multiple of {rule.dim_multiple}: {_recipe_label(recipe, rule)} runs "
            f"{step.type} step {step.name!r} as a quantized GEMM, which needs every feature dimension to "
            f"be a multiple of {rule.dim_multiple}"
        )
        suggestion = _round_up(value, rule.dim_multiple)
        hint = f"use a multiple of {rule.dim_multiple}, e.g. {suggestion}, or another recipe"
        out.append(error(f"model.ops[{step.index}].args.{arg}", "recipe-shape", message, hint))
    return out


def _alignment_diagnostic(step: Any, recipe: Mapping[str, Any], rule: ShapeRule) -> list[Diagnostic]:
    align = step.args.get("align", 1)
    if not _is_count(align) or align % rule.group_align == 0:
        return []
    message = (
        f"align={align}: {_recipe_label(recipe, rule)} quantizes the experts' grouped GEMMs, which need "
        f"every expert's group of rows to be a multiple of {rule.group_align}"
    )
    hint = f"set align: {math.lcm(align, rule.group_align)}; Dispatch pads each group with zero rows"
    return [error(f"model.ops[{step.index}].args.align", "recipe-align", message, hint)]


def _usable(steps: Iterable[Any]) -> list[Any]:
    # Torch modules are never quantized; a step with argument errors is reported where it is wrong.
    return [
        s
        for s in steps
        if s is not None and getattr(s, "kind", "op") == "op" and getattr(s, "args_valid", True)
    ]


def recipe_shape_diagnostics(steps: Iterable[Any], recipe: Mapping[str, Any] | None) -> list[Diagnostic]:
    """Every dimension of ``steps`` (planned steps: ``index``, ``name``, ``type``, ``args``) that the
    quantization ``recipe`` (a recipe config mapping) cannot run, each at its key path with the fix.

    Checked: the feature dimensions of every TE GEMM op, and the ``align`` of every Dispatch when the
    model has a grouped GEMM (its groups are what must be aligned)."""
    rule = shape_rule(recipe)
    if rule is None:
        return []
    assert recipe is not None
    planned = _usable(steps)
    out: list[Diagnostic] = []
    for step in planned:
        if step.type in GEMM_OPS:
            out.extend(_dimension_diagnostics(step, recipe, rule))
    if any(s.type == "GroupedLinear" for s in planned):
        for step in planned:
            if step.type == "Dispatch":
                out.extend(_alignment_diagnostic(step, recipe, rule))
    out.extend(_fp8_attention(steps, recipe))
    return out


FP8_ATTENTION_FIELDS = ("fp8_dpa", "fp8_mha")
"""Recipe fields that would make TE's DotProductAttention compute in FP8."""


def _fp8_attention(steps: Iterable[Any], recipe: Mapping[str, Any]) -> list[Diagnostic]:
    attention = next(
        (
            s
            for s in steps
            if s is not None and getattr(s, "kind", "op") == "module" and s.type == "Attention"
        ),
        None,
    )
    if attention is None:
        return []
    return [
        error(
            f"recipe.{field}",
            "recipe-fp8-attention",
            f"{field}: true asks TE for FP8 attention, which te_assembly does not support: attention step "
            f"{attention.name!r} runs in the model's dtype (bfloat16 on a GPU) under every recipe",
            f"set {field}: false (the recipe still quantizes the Linear GEMMs)",
        )
        for field in FP8_ATTENTION_FIELDS
        if recipe.get(field) is True
    ]


def token_multiple(steps: Iterable[Any], recipe: Mapping[str, Any] | None) -> tuple[int, str] | None:
    """``(multiple, step name)`` when the recipe quantizes a GEMM that sees the caller's token rows
    (a Linear before any Dispatch), so the number of tokens per call must be that multiple; else None."""
    rule = shape_rule(recipe)
    if rule is None:
        return None
    for step in _usable(steps):
        if step.type in TOKEN_GEMM_OPS and not getattr(step, "row_depth", 0):
            return rule.dim_multiple, step.name
    return None


__all__ = [
    "GEMM_OPS",
    "SHAPE_RULES",
    "ShapeRule",
    "recipe_shape_diagnostics",
    "shape_rule",
    "token_multiple",
]
