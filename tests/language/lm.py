"""A tiny language model for the tests: an embedding, one MLP residual-free step, a (tied) head."""

from __future__ import annotations

from typing import Any


def tiny_lm(
    vocab: int = 272, hidden: int = 16, *, tie: bool = True, attention: bool = False
) -> dict[str, Any]:
    ops: list[dict[str, Any]] = [
        {"name": "embed", "module": "Embedding", "args": {"num_embeddings": vocab, "embedding_dim": hidden}},
        {"name": "norm", "op": "RMSNorm", "args": {"normalized_shape": hidden}},
    ]
    if attention:
        ops += [
            {"name": "qkv", "op": "Linear", "args": {"in_features": hidden, "out_features": 3 * hidden}},
            {
                "name": "attn",
                "module": "Attention",
                "args": {"num_heads": 2, "head_dim": hidden // 2, "rotary": True},
            },
        ]
    ops += [
        {"name": "fc", "op": "Linear", "args": {"in_features": hidden, "out_features": hidden}},
        {"name": "act", "op": "GELU"},
    ]
    head: dict[str, Any] = {
        "name": "head",
        "op": "Linear",
        "args": {"in_features": hidden, "out_features": vocab, "bias": False},
    }
    if tie:
        head["tie_weight"] = "embed"
    ops.append(head)
    return {"name": "tiny_lm", "in_features": vocab, "input_layout": "token_ids", "ops": ops}
