"""One small, seeded input set per op (and per variant) for the gradient tests of both engines.

Every case draws its parameters at random (zero biases and unit gammas would hide bias and scale
mistakes), its float extra inputs as leaves that need a gradient, and its integer inputs as an op
would receive them (split sizes with an empty group, distinct experts per token, a row permutation).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from te_assembly.catalog import OPS, load_object
from tests.reference import oracles

F64 = torch.float64
Tensor = torch.Tensor


def _rows(x: Tensor) -> int:
    return x.reshape(-1, x.shape[-1]).shape[0]


def _split_sizes(g: torch.Generator, x: Tensor) -> Tensor:
    del g
    rows = _rows(x)
    return torch.tensor([rows // 2, 0, rows - rows // 2])  # group 1 empty


def _scales(g: torch.Generator, x: Tensor) -> Tensor:
    return torch.rand(x.shape[:-1], generator=g, dtype=F64) + 0.5


def _routing(num_experts: int, top_k: int) -> Callable[[torch.Generator, Tensor], list[Tensor]]:
    def make(g: torch.Generator, x: Tensor) -> list[Tensor]:
        tokens = _rows(x)
        probs = torch.rand(tokens, top_k, generator=g, dtype=F64) + 0.1
        # Distinct experts per token, as a router picks them; the last expert gets no token.
        routing_map = torch.stack(
            [torch.randperm(num_experts - 1, generator=g)[:top_k] for _ in range(tokens)]
        )
        return [probs / probs.sum(-1, keepdim=True), routing_map]

    return make


def _width(g: torch.Generator, x: Tensor, width: int) -> Tensor:
    """A tensor with x's rows and ``width`` features (an adapter's input beside its projection's output)."""
    return torch.randn(*x.shape[:-1], width, generator=g, dtype=F64)


def _like(g: torch.Generator, x: Tensor) -> Tensor:
    return torch.randn(x.shape, generator=g, dtype=F64)


def _row_map(g: torch.Generator, x: Tensor) -> list[Tensor]:
    return [torch.randperm(x.shape[0], generator=g)]


@dataclass(frozen=True)
class OpCase:
    id: str
    op: str
    args: dict[str, Any]
    x_shape: tuple[int, ...]
    extras: Callable[[torch.Generator, Tensor], list[Tensor]] = lambda g, x: []
    seed: int = 0
    x_scale: float = 1.0
    te: bool = True
    """Also run through the TE engine as a one-step model (needs a 2-D x)."""

    @property
    def full_args(self) -> dict[str, Any]:
        return OPS[self.op].with_defaults(self.args)

    def oracle(self) -> oracles.Oracle:
        return oracles.for_op(self.op, self.full_args)

    def reference_op(self) -> torch.nn.Module:
        op = load_object(OPS[self.op].reference)(**self.full_args, dtype=F64)
        randomize_parameters(op, self.seed)
        return op

    def inputs(self) -> tuple[Tensor, list[Tensor]]:
        """x and the extra inputs (in slot order), float ones as leaves that require grad."""
        g = torch.Generator().manual_seed(self.seed + 100)
        x = torch.randn(self.x_shape, generator=g, dtype=F64) * self.x_scale
        extras = self.extras(g, x)
        return x.requires_grad_(True), [e.requires_grad_(e.is_floating_point()) for e in extras]


def randomize_parameters(model: torch.nn.Module, seed: int, prefix: str = "") -> dict[str, Tensor]:
    """N(0, 0.5^2) in every parameter whose state-dict name starts with ``prefix``; returns them by name."""
    g = torch.Generator().manual_seed(seed + 7)
    keys = set(model.state_dict(keep_vars=True))
    named = {
        n: p for n, p in model.named_parameters(remove_duplicate=False) if n in keys and n.startswith(prefix)
    }
    with torch.no_grad():
        for name in sorted(named):
            named[name].copy_(torch.randn(named[name].shape, generator=g, dtype=F64) * 0.5)
    return named


ACTIVATION_CASES = [OpCase(name, name, {}, (5, 6)) for name in oracles.ACTIVATIONS] + [
    OpCase(name, name, {}, (5, 8)) for name in oracles.GATED
]

CASES: list[OpCase] = [
    OpCase("BasicLinear", "BasicLinear", {"in_features": 3, "out_features": 5}, (6, 3)),
    OpCase("BasicLinear-3d", "BasicLinear", {"in_features": 3, "out_features": 5}, (2, 4, 3), te=False),
    OpCase("Bias", "Bias", {"size": 4}, (6, 4)),
    OpCase("Linear", "Linear", {"in_features": 3, "out_features": 5}, (6, 3)),
    OpCase("Linear-3d", "Linear", {"in_features": 3, "out_features": 5}, (2, 4, 3), te=False),
    OpCase("Linear-nobias", "Linear", {"in_features": 3, "out_features": 5, "bias": False}, (6, 3)),
    OpCase(
        "GroupedLinear",
        "GroupedLinear",
        {"num_groups": 3, "in_features": 4, "out_features": 5},
        (7, 4),
        lambda g, x: [_split_sizes(g, x)],
    ),
    OpCase(
        "GroupedLinear-3d",
        "GroupedLinear",
        {"num_groups": 3, "in_features": 4, "out_features": 5},
        (2, 3, 4),
        lambda g, x: [_split_sizes(g, x)],
        te=False,
    ),
    OpCase(
        "GroupedLinear-1group",
        "GroupedLinear",
        {"num_groups": 1, "in_features": 4, "out_features": 5},
        (5, 4),
        lambda g, x: [torch.tensor([_rows(x)])],
    ),
    OpCase(
        "GroupedLinear-nobias",
        "GroupedLinear",
        {"num_groups": 3, "in_features": 4, "out_features": 5, "bias": False},
        (7, 4),
        lambda g, x: [_split_sizes(g, x)],
    ),
    OpCase(
        "GroupedLinear-scale_bias",
        "GroupedLinear",
        {"num_groups": 3, "in_features": 4, "out_features": 5, "scale_bias": True},
        (7, 4),
        lambda g, x: [_split_sizes(g, x), _scales(g, x)],
    ),
    *[
        OpCase(f"{norm}-zc{zc}", norm, {"normalized_shape": 7, "zero_centered_gamma": zc}, (5, 7))
        for norm in ("LayerNorm", "RMSNorm")
        for zc in (False, True)
    ],
    *[
        OpCase(f"{norm}-3d", norm, {"normalized_shape": 7, "eps": 1e-3}, (2, 3, 7), te=False)
        for norm in ("LayerNorm", "RMSNorm")
    ],
    *ACTIVATION_CASES,
    OpCase("ScaledSwiGLU", "ScaledSwiGLU", {}, (6, 8), lambda g, x: [_scales(g, x)]),
    OpCase("ScaledSwiGLU-3d", "ScaledSwiGLU", {}, (2, 3, 8), lambda g, x: [_scales(g, x)], te=False),
    *[
        OpCase(
            f"TopKRouter-{fn}-k{k}",
            "TopKRouter",
            {"in_features": 4, "num_experts": 5, "top_k": k, "score_function": fn, "aux_loss_coeff": 0.3},
            (6, 4),
            x_scale=2.0,
        )
        for fn in ("softmax", "sigmoid")
        for k in (1, 2, 5)
    ],
    *[
        OpCase(
            f"TopKRouter-{name}",
            "TopKRouter",
            {"in_features": 4, "num_experts": 5, "top_k": 2, "aux_loss_coeff": 0.3, **knobs},
            (6, 4),
            x_scale=2.0,
        )
        for name, knobs in (
            ("pre-softmax", {"pre_softmax": True}),
            ("scaled", {"scaling_factor": 2.5}),
            ("sigmoid-scaled", {"score_function": "sigmoid", "scaling_factor": 0.5}),
            ("bias", {"bias": True}),
            (
                "sigmoid-raw",
                {"score_function": "sigmoid", "sigmoid_renormalise": False, "scaling_factor": 2.5},
            ),
        )
    ],
    OpCase("Dispatch", "Dispatch", {"num_experts": 4, "top_k": 2}, (5, 3), _routing(4, 2)),
    OpCase("Dispatch-3d", "Dispatch", {"num_experts": 4, "top_k": 2}, (2, 3, 5), _routing(4, 2), te=False),
    OpCase("Combine", "Combine", {"top_k": 2}, (10, 3), _row_map),
    OpCase("ConstantScale", "ConstantScale", {"scale": -1.5}, (4, 3)),
    OpCase("SigmoidGate", "SigmoidGate", {"in_features": 5}, (6, 5), lambda g, x: [_like(g, x)], x_scale=2.0),
    OpCase(
        "SigmoidGate-3d", "SigmoidGate", {"in_features": 5}, (2, 3, 5), lambda g, x: [_like(g, x)], te=False
    ),
    OpCase("SwapExtraInput", "SwapExtraInput", {}, (4, 3), lambda g, x: [_like(g, x)]),
    OpCase(
        "SwapExtraInput-wider",
        "SwapExtraInput",
        {"value_features": 5},
        (4, 3),
        lambda g, x: [_width(g, x, 5)],
    ),
    OpCase(
        "ConcatExtraInput",
        "ConcatExtraInput",
        {"in_features": 3, "tail_features": 2},
        (4, 3),
        lambda g, x: [_width(g, x, 2)],
    ),
    OpCase("ClampedSwiGLU", "ClampedSwiGLU", {"limit": 0.6, "alpha": 1.5}, (5, 6), x_scale=2.0),
    OpCase(
        "ScaledClampedQGeGLU",
        "ScaledClampedQGeGLU",
        {"limit": 0.8, "glu_linear_offset": 0.5},
        (5, 6),
        lambda g, x: [_scales(g, x)],
        x_scale=2.0,
    ),
    OpCase(
        "LoRA",
        "LoRA",
        {"in_features": 3, "out_features": 5, "rank": 2},
        (6, 5),
        lambda g, x: [_width(g, x, 3)],
    ),
    OpCase(
        "LoRA-parts-rslora",
        "LoRA",
        {
            "in_features": 4,
            "out_features": 6,
            "rank": 2,
            "alpha": 3.0,
            "rslora": True,
            "parts": [2, 3, 1],
            "adapted": [True, False, True],
        },
        (2, 3, 6),
        lambda g, x: [_width(g, x, 4)],
        te=False,
    ),
    OpCase(
        "GroupedLoRA",
        "GroupedLoRA",
        {"num_groups": 3, "in_features": 4, "out_features": 6, "rank": 2, "parts": [3, 3]},
        (7, 6),
        lambda g, x: [_width(g, x, 4), _split_sizes(g, x)],
    ),
    OpCase(
        "AddExtraInput",
        "AddExtraInput",
        {},
        (4, 3),
        lambda g, x: [torch.randn(x.shape, generator=g, dtype=F64)],
    ),
    OpCase("MakeExtraOutput", "MakeExtraOutput", {}, (4, 3)),
]

TE_CASES = [c for c in CASES if c.te]


# --- checking a run against its oracle ---------------------------------------------------------------


def assert_grad(label: str, got: Tensor | None, want: Tensor) -> None:
    """A missing gradient is a failure of its own (``x.detach()`` inside an op gives exactly that)."""
    assert got is not None, f"{label}: no gradient reached it (expected max |grad| {want.abs().max():.3g})"
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11, msg=lambda m: f"{label}: {m}")


def assert_matches_oracle(
    labels: Sequence[str],
    got: Sequence[Tensor | None],
    want: Sequence[Tensor | None],
) -> None:
    for label, g, w in zip(labels, got, want, strict=True):
        if w is not None:
            assert_grad(label, g, w)


def cotangents(y: Tensor, outputs: Sequence[Tensor], seed: int) -> tuple[Tensor, list[Tensor | None]]:
    """One random cotangent per float output (None for integer ones)."""
    g = torch.Generator().manual_seed(seed + 200)
    draw = lambda t: torch.randn(t.shape, generator=g, dtype=F64)  # noqa: E731
    return draw(y), [draw(o) if o.is_floating_point() else None for o in outputs]


def weighted_sum(y: Tensor, outputs: Sequence[Tensor], gy: Tensor, g: Sequence[Tensor | None]) -> Tensor:
    loss = (y * gy).sum()
    for out, cot in zip(outputs, g, strict=True):
        if cot is not None:
            loss = loss + (out * cot).sum()
    return loss


def oracle_result(
    case: OpCase,
    x: Tensor,
    extras: Sequence[Tensor],
    params: dict[str, Tensor],
    gy: Tensor,
    g: Sequence[Tensor | None],
) -> oracles.Result:
    with torch.no_grad():
        return case.oracle()(
            x.detach(), [e.detach() for e in extras], {n: p.detach() for n, p in params.items()}, gy, g
        )
