"""The reference ``LatentAttention`` (DeepSeek's multi-head latent attention) beside ``transformers``'
``DeepseekV3Attention``: the same output from the same weights in float64 (interleaved and rotate-half
rotary, YaRN's softmax scale), exact gradients, and a key/value cache that keeps the latent only."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from te_assembly.engines.reference.kv_cache import KVCache, attending, cache_bytes
from te_assembly.engines.reference.latent_attention import LatentAttention
from te_assembly.engines.reference.ops.linear import init_weight

transformers = pytest.importorskip("transformers", reason="the comparison needs transformers (dev extra)")

F64 = torch.float64
SIZES = {"num_heads": 3, "qk_nope_dim": 6, "qk_rope_dim": 4, "v_head_dim": 5, "kv_lora_rank": 8}
YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 4,
    "mscale": 1.0,
    "mscale_all_dim": 0.7,
}


def _theirs(rope: dict[str, Any] | None, interleave: bool) -> Any:
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

    config = transformers.DeepseekV3Config(
        hidden_size=16,
        num_attention_heads=SIZES["num_heads"],
        num_key_value_heads=SIZES["num_heads"],
        q_lora_rank=12,
        kv_lora_rank=SIZES["kv_lora_rank"],
        qk_nope_head_dim=SIZES["qk_nope_dim"],
        qk_rope_head_dim=SIZES["qk_rope_dim"],
        v_head_dim=SIZES["v_head_dim"],
        rope_interleave=interleave,
        max_position_embeddings=64,
        rope_parameters={"rope_theta": 10000.0, **(rope or {"rope_type": "default"})},
    )
    config._attn_implementation = "sdpa"  # eager attention takes its softmax in float32
    torch.manual_seed(0)
    attention = ds.DeepseekV3Attention(config, 0).to(F64)
    with torch.no_grad():
        for param in attention.parameters():
            param.copy_(torch.randn_like(param) * 0.3)
        attention.kv_a_layernorm.variance_epsilon = 1e-6
    return attention, ds.DeepseekV3RotaryEmbedding(config).to(F64), ds


def _mine(theirs: Any, rope: dict[str, Any] | None, interleave: bool) -> LatentAttention:
    knobs: dict[str, Any] = {}
    if rope:
        knobs = {
            "rope_type": "yarn",
            "rope_factor": rope["factor"],
            "rope_original_max_positions": rope["original_max_position_embeddings"],
            "rope_mscale": rope["mscale"],
            "rope_mscale_all_dim": rope["mscale_all_dim"],
        }
    mine = LatentAttention(**SIZES, rope_interleaved=interleave, dtype=F64, **knobs)
    with torch.no_grad():
        mine.kv_norm_weight.copy_(theirs.kv_a_layernorm.weight)
        mine.kv_b_weight.copy_(theirs.kv_b_proj.weight)
    return mine


def _packed(theirs: Any, x: torch.Tensor) -> torch.Tensor:
    """What the block's projection steps hand the attention step: [queries | kv_a's output]."""
    queries = theirs.q_b_proj(theirs.q_a_layernorm(theirs.q_a_proj(x)))
    return torch.cat((queries, theirs.kv_a_proj_with_mqa(x)), dim=-1)


@pytest.mark.parametrize("interleave", [True, False])
@pytest.mark.parametrize("rope", [None, YARN])
def test_equals_transformers_deepseek_v3_attention(rope: dict[str, Any] | None, interleave: bool) -> None:
    from te_assembly.jobs.verify_hf import float64_islands_removed

    theirs, rotary, _ = _theirs(rope, interleave)
    mine = _mine(theirs, rope, interleave)
    x = torch.randn(2, 7, 16, dtype=F64)
    positions = torch.arange(7)[None].expand(2, 7)
    mask = torch.full((7, 7), float("-inf"), dtype=F64).triu(1)[None, None]
    with float64_islands_removed(theirs), torch.no_grad():
        expected, _ = theirs(x, rotary(x, positions), mask)
        got = torch.nn.functional.linear(mine(_packed(theirs, x)), theirs.o_proj.weight)
    assert mine.softmax_scale == theirs.scaling
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_the_softmax_scale_follows_yarn_mscale_all_dim() -> None:
    plain = LatentAttention(**SIZES)
    scaled = LatentAttention(**SIZES, rope_type="yarn", rope_factor=40.0, rope_mscale_all_dim=1.0)
    assert plain.softmax_scale == (6 + 4) ** -0.5
    assert scaled.softmax_scale > plain.softmax_scale * 1.8  # (0.1 ln 40 + 1)^2 = 1.87


def test_gradients_are_exact() -> None:
    torch.manual_seed(1)
    mine = LatentAttention(**SIZES, rope_interleaved=True, dtype=F64)
    x = torch.randn(1, 5, mine.in_features, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(mine, (x,))


def test_the_cache_keeps_the_latent_and_decodes_as_the_full_forward() -> None:
    torch.manual_seed(2)
    mine = LatentAttention(**SIZES, rope_type="yarn", rope_factor=4.0, rope_mscale_all_dim=0.7, dtype=F64)
    with torch.no_grad():
        mine.kv_b_weight.copy_(init_weight(*mine.kv_b_weight.shape, None, F64))
    x = torch.randn(2, 6, mine.in_features, dtype=F64)
    full = mine(x)
    # the latent and the shared key per position, not every head's keys and values
    assert cache_bytes([mine], 2, 6, F64) == 2 * 6 * (8 + 4) * 8
    per_head = 2 * 6 * 3 * ((6 + 4) + 5) * 8
    assert cache_bytes([mine], 2, 6, F64) < per_head / 3
    cache = KVCache([mine], 2, 6, x.device, F64)
    steps = []
    with attending(mine, cache):
        for start, end in ((0, 3), (3, 4), (4, 6)):  # a prompt, then one and two new positions
            steps.append(mine(x[:, start:end]))
            cache.advance(end - start)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-12)


def test_a_wrong_width_is_named() -> None:
    mine = LatentAttention(**SIZES)
    with pytest.raises(ValueError, match=r"LatentAttention takes \[batch, seq, 42\]"):
        mine(torch.randn(1, 2, 41))
