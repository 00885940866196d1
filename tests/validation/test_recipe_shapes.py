"""Each quantization recipe's shape rules, checked at config level before any GPU is touched: which
dimension breaks which rule, at its key path, with the fix."""

from __future__ import annotations

import math
from collections.abc import Callable
from subprocess import CompletedProcess

import pytest

from te_assembly import load
from te_assembly.analysis.plan import Plan
from te_assembly.analysis.recipe_shapes import SHAPE_RULES, recipe_shape_diagnostics, token_multiple
from te_assembly.analysis.recipes import available_recipes, load_recipe
from te_assembly.diagnostics import Diagnostic

# Independent of the module under test: TE 2.20's numbers (quantization.py get_align_size_for_quantization
# for groups, tests/pytorch/test_fusible_ops.py maybe_skip_quantization for dimensions), FP8 block
# scaling asked at 128 for both.
EXPECTED = {
    "bf16": None,
    "fp8_delayed": (16, 16),
    "fp8_current": (16, 16),
    "mxfp8": (32, 32),
    "fp8_block": (128, 128),
    "nvfp4": (16, 128),
}


def _plan(model: str, *overrides: str) -> Plan:
    return load(model, overrides).checked_plan()


def _errors(plan: Plan, recipe: str) -> list[Diagnostic]:
    return [d for d in recipe_shape_diagnostics(plan.steps, load_recipe(recipe)) if d.is_error]


def test_every_shipped_recipe_has_the_expected_rule() -> None:
    assert set(EXPECTED) == set(available_recipes())
    for name, expected in EXPECTED.items():
        rule = SHAPE_RULES.get(load_recipe(name)["kind"])
        assert (rule and (rule.dim_multiple, rule.group_align)) == expected, name


@pytest.mark.parametrize("recipe", ["fp8_delayed", "fp8_current", "mxfp8", "fp8_block", "nvfp4"])
@pytest.mark.parametrize("width", [16, 32, 48, 96, 128, 160, 256])
def test_linear_dims_follow_the_recipe(recipe: str, width: int) -> None:
    dims, _ = EXPECTED[recipe]  # type: ignore[misc]
    plan = _plan("residual_mlp", f"model.dims.hidden={width}", f"model.dims.ffn={width}")
    errors = _errors(plan, recipe)
    if width % dims == 0:
        assert errors == []
        return
    # fc1.in_features, fc2.out_features (hidden) and fc2.in_features (ffn); fc1's out is 2*ffn.
    expected_paths = {
        "model.ops[2].args.in_features",
        "model.ops[4].args.in_features",
        "model.ops[4].args.out_features",
    }
    if (2 * width) % dims:
        expected_paths.add("model.ops[2].args.out_features")
    assert {d.path for d in errors} == expected_paths
    for d in errors:
        assert d.code == "recipe-shape" and f"multiple of {dims}" in d.message and recipe in d.message
        value = int(d.message.split("=")[1].split()[0])
        assert d.hint is not None and f"e.g. {-(-value // dims) * dims}" in d.hint


@pytest.mark.parametrize("recipe", ["fp8_delayed", "mxfp8", "fp8_block", "nvfp4"])
@pytest.mark.parametrize("align", [1, 8, 16, 24, 32, 64, 128, 384])
def test_dispatch_alignment_follows_the_recipe(recipe: str, align: int) -> None:
    _, group = EXPECTED[recipe]  # type: ignore[misc]
    plan = _plan("moe_block_wide", f"model.dims.align={align}")
    errors = [d for d in _errors(plan, recipe) if d.code == "recipe-align"]
    if align % group == 0:
        assert errors == []
        return
    (d,) = errors
    assert d.path == "model.ops[3].args.align"
    assert f"align={align}" in d.message and f"multiple of {group}" in d.message
    assert d.hint is not None and f"set align: {math.lcm(align, group)}" in d.hint


def test_alignment_matters_only_with_a_grouped_gemm() -> None:
    # A Dispatch feeding no GroupedLinear quantizes nothing per group.
    plan = load(
        {
            "name": "route_only",
            "in_features": 16,
            "ops": [
                {
                    "name": "router",
                    "op": "TopKRouter",
                    "args": {"in_features": 16, "num_experts": 4, "top_k": 2},
                    "extra_outputs": {"probs": {"channel": "p"}, "routing_map": {"channel": "m"}},
                },
                {
                    "name": "dispatch",
                    "op": "Dispatch",
                    "args": {"num_experts": 4, "top_k": 2},
                    "extra_inputs": {"probs": "p", "routing_map": "m"},
                    "extra_outputs": {"row_map": {"channel": "r"}},
                },
                {"name": "combine", "op": "Combine", "args": {"top_k": 2}, "extra_inputs": {"row_map": "r"}},
            ],
        }
    ).checked_plan()
    assert _errors(plan, "nvfp4") == []


def test_bf16_and_no_recipe_have_no_rules() -> None:
    plan = _plan("moe_block", "model.dims.hidden=10", "model.dims.align=3")
    assert recipe_shape_diagnostics(plan.steps, load_recipe("bf16")) == []
    assert recipe_shape_diagnostics(plan.steps, None) == []
    assert recipe_shape_diagnostics(plan.steps, {"kind": "NotAKind"}) == []  # validate_recipe reports it


@pytest.mark.parametrize(
    ("model", "recipes"),
    [
        # What the GPU check runs (scripts/gpu_report.py): these must validate as shipped.
        ("residual_mlp", ["bf16", "fp8_delayed", "fp8_current", "mxfp8", "nvfp4"]),
        ("moe_block", ["bf16", "fp8_delayed", "fp8_current"]),
        ("moe_block_wide", available_recipes()),
    ],
)
def test_shipped_models_fit_the_recipes_the_gpu_check_runs(model: str, recipes: list[str]) -> None:
    plan = _plan(model)
    for recipe in recipes:
        assert _errors(plan, recipe) == [], (model, recipe)


def test_moe_block_needs_the_wide_variant_for_block_scaling() -> None:
    paths = {d.path for d in _errors(_plan("moe_block"), "fp8_block")}
    assert paths == {
        "model.ops[3].args.align",
        "model.ops[4].args.in_features",
        "model.ops[6].args.out_features",
    }


def test_token_rows_rule() -> None:
    assert token_multiple(_plan("residual_mlp").steps, load_recipe("fp8_block")) == (128, "fc1")
    assert token_multiple(_plan("residual_mlp").steps, load_recipe("mxfp8")) == (32, "fc1")
    assert token_multiple(_plan("residual_mlp").steps, load_recipe("bf16")) is None
    # In moe_block every GEMM is behind the Dispatch, whose alignment makes its rows fit: any token count.
    assert token_multiple(_plan("moe_block").steps, load_recipe("fp8_current")) is None


def test_validate_command_names_the_dimension_and_the_fix(
    run_cli: Callable[..., CompletedProcess[str]],
) -> None:
    result = run_cli(["validate", "model=moe_block", "recipe=fp8_block"])
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(lines) == 3, result.stderr
    align = next(line for line in lines if "args.align" in line)
    assert "moe_block.yaml:" in align and "align=16" in align and "multiple of 128" in align
    assert "set align: 128" in align
    assert any("in_features=64 is not a multiple of 128" in line for line in lines)
    ok = run_cli(["validate", "model=moe_block_wide", "recipe=fp8_block"])
    assert ok.returncode == 0, ok.stderr
