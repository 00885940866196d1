"""First contact with TE's kernels on a GPU (called by scripts/gpu_check.sh).

``check``: te.Linear, te.LayerNorm and a channelled te.ops block, forward and backward, against plain
torch; exits 1 with a message on the first mismatch. ``bench``: the moe_block forward+backward time of
the TE engine and of the reference engine on this GPU, reported as a ratio measured in one run (used
only when the ``bench`` command is missing).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch  # before transformer_engine: TE's core library needs torch's libnccl loaded

BF16_TOL = {"atol": 2e-2, "rtol": 2e-2}


def _fail(message: str) -> None:
    print(f"[gpu_sanity] FAIL: {message}", file=sys.stderr)
    raise SystemExit(1)


def _close(name: str, got: torch.Tensor | None, expected: torch.Tensor | None, **tol: float) -> None:
    if got is None or expected is None:
        _fail(f"{name}: missing tensor (got {got is not None}, expected {expected is not None})")
        return
    if not torch.isfinite(got).all():
        _fail(f"{name}: non-finite values")
    scale = expected.float().abs().max().item()
    err = (got.float() - expected.float()).abs().max().item()
    if err > tol["atol"] + tol["rtol"] * scale:
        _fail(f"{name}: max abs err {err:.3e} vs max |ref| {scale:.3e} (tol {tol})")
    print(f"[gpu_sanity] ok   {name}: max abs err {err:.3e}, max |ref| {scale:.3e}")


def _check_linear(te: object, dtype: torch.dtype, tol: dict[str, float]) -> None:
    torch.manual_seed(0)
    layer = te.Linear(128, 64, bias=True, params_dtype=dtype, device="cuda")  # type: ignore[attr-defined]
    with torch.no_grad():
        layer.bias.normal_()
    x = torch.randn(32, 128, device="cuda", dtype=dtype, requires_grad=True)
    xr = x.detach().clone().requires_grad_(True)
    w, b = (
        layer.weight.detach().clone().requires_grad_(True),
        layer.bias.detach().clone().requires_grad_(True),
    )
    y, yr = layer(x), torch.nn.functional.linear(xr, w, b)
    dy = torch.randn_like(y)
    y.backward(dy)
    yr.backward(dy)
    label = str(dtype).removeprefix("torch.")
    _close(f"te.Linear {label} y", y, yr, **tol)
    _close(f"te.Linear {label} dx", x.grad, xr.grad, **tol)
    _close(f"te.Linear {label} dW", layer.weight.grad, w.grad, **tol)
    _close(f"te.Linear {label} db", layer.bias.grad, b.grad, **tol)


def _check_layernorm(te: object) -> None:
    torch.manual_seed(1)
    norm = te.LayerNorm(128, eps=1e-5, params_dtype=torch.float32, device="cuda")  # type: ignore[attr-defined]
    x = torch.randn(32, 128, device="cuda", requires_grad=True)
    xr = x.detach().clone().requires_grad_(True)
    y = norm(x)
    yr = torch.nn.functional.layer_norm(xr, (128,), norm.weight.detach(), norm.bias.detach(), 1e-5)
    dy = torch.randn_like(y)
    y.backward(dy)
    yr.backward(dy)
    _close("te.LayerNorm y", y, yr, atol=1e-4, rtol=1e-4)
    _close("te.LayerNorm dx", x.grad, xr.grad, atol=1e-4, rtol=1e-4)


def _check_channelled_ops(te: object) -> None:
    """x -> tap(residual) -> ops.Linear -> + residual: TE's fuser, channel and GEMM together."""
    torch.manual_seed(2)
    ops = te.ops  # type: ignore[attr-defined]
    tap = ops.MakeExtraOutput().set_extra_output_channel(0, "residual", output_to_caller=False)
    linear = ops.Linear(64, 64, device="cuda", dtype=torch.float32)
    add = ops.AddExtraInput().set_extra_input_channel(0, "residual")
    block = ops.Sequential(tap, linear, add)
    x = torch.randn(16, 64, device="cuda", requires_grad=True)
    xr = x.detach().clone().requires_grad_(True)
    w = linear.weight.detach().clone()
    b = linear.bias.detach().clone()
    y, yr = block(x), torch.nn.functional.linear(xr, w, b) + xr
    dy = torch.randn_like(y)
    y.backward(dy)
    yr.backward(dy)
    _close("te.ops channelled residual y", y, yr, atol=1e-4, rtol=1e-4)
    _close("te.ops channelled residual dx", x.grad, xr.grad, atol=1e-4, rtol=1e-4)


def check() -> None:
    import transformer_engine
    import transformer_engine.pytorch as te

    cap = torch.cuda.get_device_capability()
    print(
        f"[gpu_sanity] TE {transformer_engine.__version__}, torch {torch.__version__} "
        f"(CUDA {torch.version.cuda}), "
        f"{torch.cuda.get_device_name()} sm_{cap[0]}{cap[1]}"
    )
    _check_linear(te, torch.float32, {"atol": 1e-4, "rtol": 1e-4})
    _check_linear(te, torch.bfloat16, BF16_TOL)
    _check_layernorm(te)
    _check_channelled_ops(te)
    print("[gpu_sanity] all kernel checks passed")


def _median_ms(fn: Callable[[], None], iters: int = 20, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def bench(model: str, tokens: int) -> None:
    from te_assembly import load
    from te_assembly.engines import build
    from te_assembly.engines.data import sample_public_inputs, sample_x

    plan = load(model).checked_plan()
    dev, dtype = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    x = sample_x(plan, tokens, generator=gen, device=dev, dtype=dtype).requires_grad_(True)
    inputs = sample_public_inputs(plan, tokens, generator=gen, device=dev, dtype=dtype)
    results = {}
    for engine in ("reference", "te"):
        m = build(plan, engine=engine, device=dev, dtype=dtype)

        def step(m: torch.nn.Module = m) -> None:
            y, extras = m(x, **inputs)
            loss = y.float().square().mean() + sum(
                v.float().sum() for v in extras.values() if v.is_floating_point()
            )
            loss.backward()

        results[engine] = _median_ms(step)
        print(
            f"[gpu_sanity] bench {model} tokens={tokens} engine={engine}: "
            f"{results[engine]:.3f} ms/step (median)"
        )
    print(f"[gpu_sanity] bench ratio reference/te = {results['reference'] / results['te']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="mode", required=True)
    sub.add_parser("check")
    b = sub.add_parser("bench")
    b.add_argument("--model", default="moe_block")
    b.add_argument("--tokens", type=int, default=4096)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        _fail("no CUDA GPU visible")
    if args.mode == "check":
        check()
    else:
        bench(args.model, args.tokens)


if __name__ == "__main__":
    main()
