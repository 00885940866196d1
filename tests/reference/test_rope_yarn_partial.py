"""YaRN and partial rotary in the reference ``Attention`` against ``transformers``' own functions: the
frequencies and attention factor of ``ROPE_INIT_FUNCTIONS["yarn"]`` bit for bit, and the rotation of a
partial-rotary model (GLM-4.5's ``apply_rotary_pos_emb``, first ``partial_rotary_factor * head_dim``
features turned) in float64."""

from __future__ import annotations

import pytest
import torch

from te_assembly.engines.reference.attention import Attention, Rope

transformers = pytest.importorskip("transformers", reason="the comparison needs transformers (dev extra)")

YARN = [
    {"factor": 4.0, "original_max_position_embeddings": 64},
    {
        "factor": 8.0,
        "original_max_position_embeddings": 32,
        "beta_fast": 16.0,
        "beta_slow": 2.0,
        "truncate": False,
    },
    {"factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 1.0},
    {"factor": 32.0, "original_max_position_embeddings": 4096, "mscale": 0.707, "mscale_all_dim": 0.3},
    {"factor": 2.0, "original_max_position_embeddings": 128, "attention_factor": 1.3},
]


def _rope(params: dict[str, object]) -> Rope:
    return Rope(
        10000.0,
        "yarn",
        float(params["factor"]),  # type: ignore[arg-type]
        original_max_positions=int(params["original_max_position_embeddings"]),  # type: ignore[call-overload]
        beta_fast=float(params.get("beta_fast", 32.0)),  # type: ignore[arg-type]
        beta_slow=float(params.get("beta_slow", 1.0)),  # type: ignore[arg-type]
        mscale=params.get("mscale"),  # type: ignore[arg-type]
        mscale_all_dim=params.get("mscale_all_dim"),  # type: ignore[arg-type]
        attention_factor=params.get("attention_factor"),  # type: ignore[arg-type]
        truncate=bool(params.get("truncate", True)),
    )


@pytest.mark.parametrize("params", YARN)
@pytest.mark.parametrize("dim", [16, 64])
def test_yarn_frequencies_and_factor_are_transformers_own(params: dict[str, object], dim: int) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(
        hidden_size=4 * dim,
        num_attention_heads=4,
        head_dim=dim,
        max_position_embeddings=int(params["original_max_position_embeddings"]) * 4,  # type: ignore[call-overload]
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, **params},
    )
    inv_freq, factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    rope = _rope(params)
    assert torch.equal(rope.inv_freq(dim), inv_freq)
    assert rope.scale == factor


def test_partial_rotary_with_yarn_rotates_as_glm_does() -> None:
    from transformers.models.glm4_moe import modeling_glm4_moe as glm

    head_dim, heads = 16, 2
    config = transformers.Glm4MoeConfig(
        hidden_size=32,
        num_attention_heads=heads,
        head_dim=head_dim,
        partial_rotary_factor=0.5,
        max_position_embeddings=64,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 8,
            "partial_rotary_factor": 0.5,
        },
    )
    rotary = glm.Glm4MoeRotaryEmbedding(config)
    qkv = torch.randn(2, 11, 3 * heads * head_dim, dtype=torch.float64)
    module = Attention(
        heads,
        head_dim,
        heads,
        rotary=True,
        rope_type="yarn",
        rope_factor=4.0,
        rope_original_max_positions=8,
        rotary_dim=8,
    )
    q, k, _ = module.split_heads(qkv)
    plain_q, plain_k, _ = Attention(heads, head_dim, heads).split_heads(qkv)
    positions = torch.arange(11)[None, :].expand(2, -1)
    cos, sin = rotary(plain_q, positions)
    # transformers' layout: [batch, heads, seq, head_dim]
    theirs_q, theirs_k = glm.apply_rotary_pos_emb(plain_q.transpose(1, 2), plain_k.transpose(1, 2), cos, sin)
    torch.testing.assert_close(q, theirs_q.transpose(1, 2), rtol=0, atol=1e-12)
    torch.testing.assert_close(k, theirs_k.transpose(1, 2), rtol=0, atol=1e-12)
    assert not torch.equal(q[..., 8:], q[..., :8])  # both halves present, only the first turned
    torch.testing.assert_close(q[..., 8:], plain_q[..., 8:], rtol=0, atol=0)
