"""The gpu tier: TE's kernels against the reference engine on a CUDA GPU, under BF16 and every shipped
quantization recipe this GPU supports."""

from __future__ import annotations

import pytest
import torch

from te_assembly.errors import UnsupportedRecipeError
from te_assembly.recipes import available_recipes, check_recipe_supported, load_recipe

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("recipe_name", available_recipes())
@pytest.mark.parametrize("model", ["residual_mlp", "moe_block"])
def test_te_kernels_match_reference(model: str, recipe_name: str) -> None:
    from te_assembly.verify import verify

    recipe = load_recipe(recipe_name)
    capability = torch.cuda.get_device_capability()
    try:
        check_recipe_supported(recipe, capability, torch.version.cuda)
    except UnsupportedRecipeError as exc:
        pytest.skip(str(exc))
    report = verify(model, kernels="te", device="cuda", dtype=torch.bfloat16, recipe=recipe, tokens=256)
    assert report.kernels == "te" and report.comparisons
    assert report.passed, [(c.name, c.max_abs, c.max_rel) for c in report.failures]
