"""How far float32 through TE's GEMMs (run as TF32) lands from true float32, emulated on CPU: where the
``tf32`` tolerance in te_assembly/jobs/verify.py comes from.

TE runs every all-float32 GEMM with ``CUBLAS_COMPUTE_32F_FAST_TF32``: each operand is cut to TF32's 10
mantissa bits and the products are summed in float32. This script runs the reference engine twice on the
same weights, inputs and cotangents (verify's loss), once with every GEMM's operands rounded to TF32 at
the dispatcher (forward and backward alike; the router's scoring GEMM is left in float32, as it runs in
plain torch outside TE), and reports verify's measure, max |err| / max |ref|, for the worst tensor. Both
conversions are tried: round to nearest and truncation (which tensor cores may do).

    python bench/tf32_error.py [--seeds 5] [--tokens 256] [--models residual_mlp,moe_block]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from te_assembly import load
from te_assembly.engines import build
from te_assembly.engines.data import sample_public_inputs, sample_x
from te_assembly.engines.reference.ops.moe import TopKRouter
from te_assembly.engines.target import Target
from te_assembly.jobs.verify import (
    TOLERANCES,
    _forward_backward,
    compare,
    copy_weights,
    fill_zero_parameters,
)

_GEMMS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}


def to_tf32(t: Any, truncate: bool) -> Any:
    """``t`` with 10 mantissa bits, rounded to nearest or truncated (float32 tensors only)."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
        return t
    bits = t.contiguous().view(torch.int32)
    half = 0 if truncate else 1 << 12
    return ((bits + half) & ~((1 << 13) - 1)).view(torch.float32)


class TF32Gemms(TorchDispatchMode):
    def __init__(self, truncate: bool) -> None:
        super().__init__()
        self.truncate = truncate

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in _GEMMS:
            first = 1 if func is torch.ops.aten.addmm.default else 0  # addmm's bias is not a GEMM operand
            args = (
                *args[:first],
                *(to_tf32(a, self.truncate) for a in args[first : first + 2]),
                *args[first + 2 :],
            )
        return func(*args, **(kwargs or {}))


def _router_outside_tf32() -> Callable[[], None]:
    original = TopKRouter._scores

    def scores(self: TopKRouter, tokens: torch.Tensor) -> torch.Tensor:
        with _disable_current_modes():
            return original(self, tokens)

    TopKRouter._scores = scores  # type: ignore[method-assign]
    return lambda: setattr(TopKRouter, "_scores", original)


def worst(model: str, seed: int, tokens: int, truncate: bool) -> tuple[str, float]:
    plan = load(model).checked_plan()
    torch.manual_seed(seed)
    reference = build(plan, Target.of("reference", dtype=torch.float32))
    fill_zero_parameters(reference, seed)
    candidate = build(plan, Target.of("reference", dtype=torch.float32))
    copy_weights(reference, candidate)
    reference.eval()
    candidate.eval()
    gen = torch.Generator().manual_seed(seed)
    cpu = torch.device("cpu")
    x = sample_x(plan, tokens, generator=gen, device=cpu, dtype=torch.float32)
    inputs = sample_public_inputs(plan, tokens, generator=gen, device=cpu, dtype=torch.float32)
    ref, cotangents = _forward_backward(reference, x, inputs, None, seed)
    with TF32Gemms(truncate):
        got, _ = _forward_backward(candidate, x, inputs, cotangents, seed)
    tol = TOLERANCES["tf32"]
    pairs = [("y", got.y, ref.y)]
    pairs += [(n, got.outputs.get(n), v) for n, v in ref.outputs.items()]
    pairs += [(f"grad {n}", got.input_grads.get(n), v) for n, v in ref.input_grads.items()]
    pairs += [(f"grad {n}", got.param_grads.get(n), v) for n, v in ref.param_grads.items()]
    rows = [compare(name, "", a, b, tol) for name, a, b in pairs]
    row = max(rows, key=lambda r: r.max_rel)
    return row.name, row.max_rel


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--models", default="residual_mlp,moe_block")
    args = parser.parse_args()
    restore = _router_outside_tf32()
    tol = TOLERANCES["tf32"]
    print(f"tf32 tolerance: max |err| <= {tol.atol:g} + {tol.rtol:g} * max |ref|")
    print("| model | conversion | worst max |err| / max |ref| over seeds | tensor |")
    print("| --- | --- | ---: | --- |")
    try:
        for model in args.models.split(","):
            for truncate in (False, True):
                results = [worst(model, s, args.tokens, truncate) for s in range(args.seeds)]
                name, value = max(results, key=lambda r: r[1])
                mode = "truncate" if truncate else "round to nearest"
                print(f"| {model} | {mode} | {value:.2e} | {name} |")
    finally:
        restore()


if __name__ == "__main__":
    main()
