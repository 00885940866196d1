"""The gpu tier for attention: TE's ``DotProductAttention`` and fused RoPE (``TEAttention``) against the
reference module (torch's scaled_dot_product_attention), forward and gradient, in bfloat16 and float32;
then a decoder layer through ``verify`` with TE's kernels, and an FP8 recipe that quantizes the Linears
around attention while attention itself stays in bfloat16."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from te_assembly import load
from te_assembly.analysis.recipes import load_recipe
from te_assembly.analysis.settings import RunSettings
from te_assembly.engines.target import Target
from te_assembly.jobs.verify import TOLERANCES, compare

pytestmark = pytest.mark.gpu

LAYER = Path(__file__).resolve().parents[1] / "configs" / "model" / "attention_layer.yaml"

CASES = [
    # heads, kv heads, head_dim, causal, rotary
    (4, 2, 64, True, True),  # GQA + RoPE, causal: the decoder's case
    (8, 8, 32, True, False),  # plain multi-head
    (4, 1, 64, False, True),  # multi-query, not causal
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize(("h", "g", "d", "causal", "rotary"), CASES)
def test_te_attention_matches_the_reference_module(
    h: int, g: int, d: int, causal: bool, rotary: bool, dtype: torch.dtype
) -> None:
    import transformer_engine.pytorch as te

    from te_assembly.engines.reference.attention import Attention
    from te_assembly.engines.te.attention import TEAttention

    device = torch.device("cuda")
    mine = TEAttention(h, d, g, causal=causal, rotary=rotary, device=device, dtype=dtype)
    assert isinstance(mine.te_attention, te.DotProductAttention)
    assert mine.state_dict() == {}  # nothing that would make state dicts differ between engines
    reference = Attention(h, d, g, causal=causal, rotary=rotary)
    generator = torch.Generator().manual_seed(0)
    qkv = torch.randn(2, 128, (h + 2 * g) * d, generator=generator).to(device=device, dtype=dtype)
    cotangent = torch.randn(2, 128, h * d, generator=generator).to(device=device, dtype=torch.float32)
    results = []
    for module in (mine, reference):
        x = qkv.clone().requires_grad_(True)
        y = module(x)
        (y.float() * cotangent).sum().backward()
        assert y.shape == (2, 128, h * d) and y.dtype == dtype
        results.append((y.detach(), x.grad))
    tolerance = TOLERANCES["bfloat16" if dtype == torch.bfloat16 else "tf32"]
    for name, got, want in (("y", results[0][0], results[1][0]), ("grad qkv", results[0][1], results[1][1])):
        row = compare(name, "attention", got, want, tolerance)
        assert row.passed, (name, row.max_abs, row.max_rel)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_decoder_layer_verifies_with_te_kernels(dtype: torch.dtype) -> None:
    from te_assembly.jobs.verify import verify

    plan = load(LAYER, ["model.dims.hidden=64", "model.dims.head_dim=16", "model.dims.ffn=64"]).checked_plan()
    report = verify(
        plan, Target.of("te", kernels="te", device="cuda", dtype=dtype), RunSettings(tokens=256, seq_len=64)
    )
    assert report.kernels == "te"
    assert report.passed, [(c.name, c.max_abs, c.max_rel) for c in report.failures]


def test_fp8_recipe_quantizes_the_linears_around_bf16_attention() -> None:
    from te_assembly.engines.te.recipe import check_recipe_supported
    from te_assembly.errors import UnsupportedRecipeError
    from te_assembly.jobs.verify import verify

    recipe = load_recipe("fp8_current")
    try:
        check_recipe_supported(recipe, torch.cuda.get_device_capability(), torch.version.cuda)
    except UnsupportedRecipeError as exc:
        pytest.skip(f"this GPU cannot run it: {exc}")  # hardware, not code
    mapping = {
        "name": "attn_fp8",
        "in_features": 64,
        "input_layout": "sequence",
        "ops": [
            {"name": "qkv", "op": "Linear", "args": {"in_features": 64, "out_features": 128}},
            {
                "name": "attn",
                "module": "Attention",
                "args": {"num_heads": 4, "num_kv_heads": 2, "head_dim": 16, "rotary": True},
            },
            {"name": "proj", "op": "Linear", "args": {"in_features": 64, "out_features": 64}},
        ],
    }
    plan = load(mapping).checked_plan()
    report = verify(
        plan,
        Target.of("te", kernels="te", device="cuda", dtype=torch.bfloat16, recipe=recipe),
        RunSettings(tokens=256, seq_len=64),
    )
    assert report.precision == "fp8"
    assert report.passed, [(c.name, c.max_abs, c.max_rel) for c in report.failures]


HF_CASES = [
    # the Hugging Face families' knobs: llama3 RoPE scaling, Qwen3's qk_norm, Mistral's window
    {"rope_type": "llama3", "rope_factor": 8.0, "rope_original_max_positions": 32, "rotary_base": 500000.0},
    {"qk_norm": True},
    {"sliding_window": 16},
    # YaRN (Qwen2.5's long context, DeepSeek-V3, GPT-OSS) with GLM-4.5's partial rotary: TE's fused RoPE
    # turns the first rotary_dim features, the attention factor is applied after it
    {"rope_type": "yarn", "rope_factor": 4.0, "rope_original_max_positions": 16, "rotary_dim": 32},
    # Gemma 3: (1 + w) q/k norms, query_pre_attn_scalar's softmax scale (TE's softmax_scale), a window
    {"qk_norm": True, "qk_norm_zero_centered": True, "softmax_scale": 0.1, "sliding_window": 16},
]


@pytest.mark.parametrize("knobs", HF_CASES, ids=["llama3", "qk_norm", "window", "yarn-partial", "gemma3"])
def test_te_attention_matches_the_reference_with_hugging_face_knobs(knobs: dict[str, object]) -> None:
    from te_assembly.engines.reference.attention import Attention
    from te_assembly.engines.te.attention import TEAttention

    device, dtype = torch.device("cuda"), torch.float32
    mine = TEAttention(4, 64, 2, rotary=True, device=device, dtype=dtype, **knobs)  # type: ignore[arg-type]
    reference = Attention(4, 64, 2, rotary=True, **knobs).to(device)  # type: ignore[arg-type]
    if knobs.get("qk_norm"):
        with torch.no_grad():
            for value in mine.state_dict().values():
                value.copy_(torch.rand_like(value) + 0.5)
        reference.load_state_dict(mine.state_dict())
    generator = torch.Generator().manual_seed(1)
    qkv = torch.randn(2, 64, 8 * 64, generator=generator).to(device=device, dtype=dtype)
    with torch.no_grad():
        row = compare("y", "attention", mine(qkv), reference(qkv), TOLERANCES["tf32"])
    assert row.passed, (knobs, row.max_abs, row.max_rel)


@pytest.mark.parametrize("window", [None, 32])
def test_te_attention_with_sinks_matches_the_reference_module(window: int | None) -> None:
    """GPT-OSS's attention sinks through TE's learnable softmax offset (``softmax_type='learnable'``),
    the sink gradient included, against the reference module's written-out softmax."""
    from te_assembly.engines.reference.attention import Attention
    from te_assembly.engines.te.attention import TEAttention

    device, dtype = torch.device("cuda"), torch.bfloat16
    mine = TEAttention(4, 64, 2, rotary=True, sliding_window=window, sinks=True, device=device, dtype=dtype)
    reference = Attention(
        4, 64, 2, rotary=True, sliding_window=window, sinks=True, device=device, dtype=dtype
    )
    generator = torch.Generator().manual_seed(0)
    sinks = torch.randn(4, generator=generator).to(device=device, dtype=dtype)
    qkv = torch.randn(2, 128, 8 * 64, generator=generator).to(device=device, dtype=dtype)
    results = []
    for module in (mine, reference):
        with torch.no_grad():
            module.sinks.copy_(sinks)
        x = qkv.clone().requires_grad_(True)
        y = module(x)
        y.float().square().sum().backward()
        results.append((y.detach(), x.grad, module.sinks.grad))
    tolerance = TOLERANCES["bfloat16"]
    names = ("y", "grad qkv", "grad sinks")
    for name, got, want in zip(names, results[0], results[1], strict=True):
        row = compare(name, "attention", got, want, tolerance)
        assert row.passed, (name, row.max_abs, row.max_rel)
