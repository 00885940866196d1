"""The gpu tier: TE's kernels against the reference engine on a CUDA GPU, under BF16, float32 (TF32) and
every shipped quantization recipe this GPU supports, with proof that each recipe is really on.

A recipe's tolerance alone proves little: the fp8 and fp4 tolerances are loose enough that plain bf16
output meets them, so a model that silently ignored its recipe would pass. ``recipe_effect`` compares
TE under the recipe with TE in bfloat16 on the same weights: the recipe must move the output by more than
the bfloat16 noise between the engines, and still match the reference within its tolerance.

A (model, recipe) pair whose dimensions the recipe cannot run is not skipped: the builder must refuse it
with a config error (the validator's shape rules), which is checked instead.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from te_assembly import load
from te_assembly.analysis.plan import Plan
from te_assembly.analysis.recipe_shapes import recipe_shape_diagnostics
from te_assembly.analysis.recipes import available_recipes, load_recipe
from te_assembly.analysis.settings import RunSettings
from te_assembly.engines.target import Target
from te_assembly.engines.te.recipe import check_recipe_supported
from te_assembly.errors import ConfigError, UnsupportedRecipeError

pytestmark = pytest.mark.gpu

MODELS = ["residual_mlp", "moe_block", "moe_block_wide"]
QUANTIZING = [name for name in available_recipes() if load_recipe(name)["kind"] != "none"]


def _plan(model: str, *overrides: str) -> Plan:
    return load(model, overrides).checked_plan()


def _supported_or_skip(recipe: dict[str, Any]) -> None:
    try:
        check_recipe_supported(recipe, torch.cuda.get_device_capability(), torch.version.cuda)
    except UnsupportedRecipeError as exc:
        pytest.skip(f"this GPU cannot run it: {exc}")  # hardware, not code: MXFP8/NVFP4 on sm_90


@pytest.mark.parametrize("recipe_name", available_recipes())
@pytest.mark.parametrize("model", MODELS)
def test_te_kernels_match_reference(model: str, recipe_name: str) -> None:
    from te_assembly.jobs.verify import verify

    recipe = load_recipe(recipe_name)
    _supported_or_skip(recipe)
    plan = _plan(model)
    if [d for d in recipe_shape_diagnostics(plan.steps, recipe) if d.is_error]:
        with pytest.raises(ConfigError, match="does not fit the quantization recipe"):
            verify(
                plan,
                Target.of("te", kernels="te", device="cuda", dtype=torch.bfloat16, recipe=recipe),
                RunSettings(tokens=256),
            )
        return
    report = verify(
        plan,
        Target.of("te", kernels="te", device="cuda", dtype=torch.bfloat16, recipe=recipe),
        RunSettings(tokens=256),
    )
    assert report.kernels == "te" and report.comparisons
    assert report.passed, [(c.name, c.max_abs, c.max_rel) for c in report.failures]


@pytest.mark.parametrize("model", ["residual_mlp", "moe_block"])
def test_float32_through_te_is_tf32(model: str) -> None:
    """TE runs float32 GEMMs as TF32: verify holds them to the tf32 class, and they pass it."""
    from te_assembly.jobs.verify import verify

    report = verify(
        model, Target.of("te", kernels="te", device="cuda", dtype=torch.float32), RunSettings(tokens=256)
    )
    assert report.precision == "tf32"
    assert report.passed, [(c.name, c.max_abs, c.max_rel) for c in report.failures]


# Each recipe on a model its shape rules accept: residual_mlp widened for FP8 block scaling, the MoE
# block in its 128-wide variant (dims and expert groups fit every recipe).
ACTIVE_CASES = [
    ("residual_mlp", ("model.dims.hidden=128", "model.dims.ffn=256")),
    ("moe_block_wide", ()),
]


@pytest.mark.parametrize("recipe_name", QUANTIZING)
@pytest.mark.parametrize(("model", "overrides"), ACTIVE_CASES)
def test_recipe_is_active(model: str, overrides: tuple[str, ...], recipe_name: str) -> None:
    from te_assembly.jobs.verify import ACTIVE_FACTOR, TOLERANCES, precision_class, recipe_effect

    recipe = load_recipe(recipe_name)
    _supported_or_skip(recipe)
    effect = recipe_effect(_plan(model, *overrides), Target.of("te", device="cuda"), recipe, tokens=256)
    assert effect.active, (
        f"{recipe_name} did not move the output off bfloat16: RMS shift {effect.shift:.3e} vs bfloat16 "
        f"noise {effect.noise:.3e} (needs > {ACTIVE_FACTOR}x) and output RMS {effect.scale:.3e}"
    )
    tol = TOLERANCES[precision_class(torch.bfloat16, recipe)]
    assert effect.error <= tol.atol + tol.rtol * effect.scale, effect


def test_model_ignoring_its_recipe_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted bug issue 14 found: a TE model that runs without its autocast. recipe_effect must
    call it inactive."""
    import contextlib

    from te_assembly.engines.te.model import TEModel
    from te_assembly.jobs.verify import recipe_effect

    recipe = load_recipe("fp8_current")
    _supported_or_skip(recipe)
    monkeypatch.setattr(TEModel, "quantization", lambda self: contextlib.nullcontext())
    effect = recipe_effect(_plan("moe_block_wide"), Target.of("te", device="cuda"), recipe, tokens=256)
    assert not effect.active, effect


def test_token_rows_the_recipe_cannot_run_are_a_call_error() -> None:
    from te_assembly.engines import build
    from te_assembly.engines.base import CallError

    recipe = load_recipe("fp8_current")
    _supported_or_skip(recipe)
    model = build("residual_mlp", Target.of("te", device="cuda", dtype=torch.bfloat16, recipe=recipe))
    with pytest.raises(CallError, match="multiple of 16 rows"):
        model(torch.randn(10, 64, device="cuda", dtype=torch.bfloat16))
    y, _ = model(torch.randn(16, 64, device="cuda", dtype=torch.bfloat16))
    assert y.shape == (16, 64)
