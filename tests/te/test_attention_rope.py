"""TE's own rotary-embedding helpers agree with the reference module's rotation, on CPU: the
convention ``TEAttention`` relies on (``RotaryPositionEmbedding(head_dim, rotary_base)`` with
``interleaved=False``, ``apply_rotary_pos_emb(..., tensor_format="bshd")``). TE's fused kernel needs a
GPU (the gpu tier compares it); its unfused path is the same math in torch ops."""

from __future__ import annotations

import pytest
import torch

from te_assembly.engines.reference.attention import Attention

pytestmark = pytest.mark.te


@pytest.mark.parametrize(("head_dim", "base"), [(8, 10000.0), (16, 500.0)])
def test_te_rotary_helpers_rotate_as_the_reference_does(
    head_dim: int, base: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformer_engine.pytorch.attention.rope import RotaryPositionEmbedding, apply_rotary_pos_emb

    # TE places inv_freq on torch.cuda.current_device(); on a machine without a GPU, the CPU.
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    rope = RotaryPositionEmbedding(head_dim, rotary_base=base, interleaved=False)
    seq, heads = 7, 3
    freqs = rope(seq)
    assert freqs.shape == (seq, 1, 1, head_dim)
    qkv = torch.randn(2, seq, 3 * heads * head_dim, dtype=torch.float32)
    module = Attention(heads, head_dim, heads, rotary=True, rotary_base=base)
    rotated_q, rotated_k, _ = module.split_heads(qkv)
    plain_q, plain_k, _ = Attention(heads, head_dim, heads).split_heads(qkv)
    for rotated, plain in ((rotated_q, plain_q), (rotated_k, plain_k)):
        te_rotated = apply_rotary_pos_emb(plain, freqs, tensor_format="bshd", interleaved=False, fused=False)
        torch.testing.assert_close(rotated, te_rotated, rtol=1e-5, atol=1e-5)


def test_partial_yarn_rotation_through_te_helpers_is_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``TEAttention`` does for YaRN and partial rotary: TE's rotation of the first rotary_dim
    features (the rest pass), then YaRN's attention factor on the turned features."""
    from transformer_engine.pytorch.attention.rope import apply_rotary_pos_emb

    knobs = {"rope_type": "yarn", "rope_factor": 4.0, "rope_original_max_positions": 4, "rotary_dim": 8}
    module = Attention(2, 16, 2, rotary=True, **knobs)  # type: ignore[arg-type]
    assert module.rope.scale > 1.0
    qkv = torch.randn(2, 9, 3 * 2 * 16, dtype=torch.float64)
    rotated_q, _, _ = module.split_heads(qkv)
    plain_q, _, _ = Attention(2, 16, 2).split_heads(qkv)
    freqs = module.rope.angles(9, 8)[:, None, None, :].double()
    te_q = apply_rotary_pos_emb(plain_q, freqs, tensor_format="bshd", interleaved=False, fused=False)
    te_q = torch.cat((te_q[..., :8] * module.rope.scale, te_q[..., 8:]), dim=-1)
    torch.testing.assert_close(rotated_q, te_q, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rotated_q[..., 8:], plain_q[..., 8:], rtol=0, atol=0)  # passed unchanged
