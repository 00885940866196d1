"""First contact with TE's kernels on a GPU (step ``sanity`` of scripts/gpu_check.sh).

``check``: te.Linear (float32 and bfloat16), te.LayerNorm, te.RMSNorm against our reference RMSNorm,
a channelled te.ops block, and te.Linear under each FP8 recipe this GPU supports, forward and backward,
against plain torch. Tolerances are verify's precision classes (``te_assembly.jobs.verify.TOLERANCES``):
float32 GEMMs through TE run as TF32, so they are held to the ``tf32`` class, not ``float32``. A recipe
check also proves the recipe is on: its output must differ from TE's bfloat16 output by more than
bfloat16 noise. Writes every result to ``--json`` and exits 1 on any failure.

``--dry-run`` does everything up to the first CUDA call: imports, tolerance lookups, recipe objects.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch  # before transformer_engine: TE's core library needs torch's libnccl loaded

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from te_assembly.jobs.verify import TOLERANCES, Tolerance  # noqa: E402

DEVICE = "cuda"
"""Where the checks run (a CPU smoke test with stand-ins for TE's modules points this at ``cpu``)."""

FP8_RECIPES = ("fp8_delayed", "fp8_current", "fp8_block")
"""The quantization recipes an sm_90 GPU runs (MXFP8 and NVFP4 need sm_100)."""


@dataclass
class Result:
    name: str
    precision: str
    max_abs: float
    scale: float
    limit: float
    passed: bool
    note: str = ""


RESULTS: list[Result] = []


def _record(name: str, precision: str, got: torch.Tensor | None, want: torch.Tensor | None) -> float:
    """Compare like verify does (max abs error <= atol + rtol * max |ref|); returns the error."""
    tol: Tolerance = TOLERANCES[precision]
    if got is None or want is None:
        RESULTS.append(Result(name, precision, float("inf"), 0.0, 0.0, False, "missing tensor"))
        return float("inf")
    err = (got.double() - want.double()).abs().max().item()
    scale = want.double().abs().max().item()
    limit = tol.atol + tol.rtol * scale
    passed = bool(torch.isfinite(got).all()) and err <= limit
    RESULTS.append(Result(name, precision, err, scale, limit, passed))
    print(
        f"[gpu_sanity] {'ok  ' if passed else 'FAIL'} {name} ({precision}): max abs err {err:.3e} "
        f"<= {limit:.3e}? (max |ref| {scale:.3e})",
        flush=True,
    )
    return err


def _linear_pair(te: Any, dtype: torch.dtype, features: int = 256) -> tuple[Any, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    layer = te.Linear(features, features, bias=True, params_dtype=dtype, device=DEVICE)
    with torch.no_grad():
        layer.bias.normal_()
    x = torch.randn(128, features, device=DEVICE, dtype=dtype)
    dy = torch.randn(128, features, device=DEVICE, dtype=dtype)
    return layer, x, dy


def _run_linear(layer: Any, x: torch.Tensor, dy: torch.Tensor, ctx: Any = None) -> dict[str, torch.Tensor]:
    import contextlib

    xx = x.clone().requires_grad_(True)
    layer.zero_grad(set_to_none=True)
    with ctx if ctx is not None else contextlib.nullcontext():
        y = layer(xx)
    y.backward(dy)
    return {"y": y.detach(), "dx": xx.grad, "dW": layer.weight.grad, "db": layer.bias.grad}


def _torch_linear(layer: Any, x: torch.Tensor, dy: torch.Tensor) -> dict[str, torch.Tensor]:
    xr = x.clone().requires_grad_(True)
    w = layer.weight.detach().clone().requires_grad_(True)
    b = layer.bias.detach().clone().requires_grad_(True)
    y = torch.nn.functional.linear(xr, w, b)
    y.backward(dy)
    return {"y": y.detach(), "dx": xr.grad, "dW": w.grad, "db": b.grad}


def check_linear(te: Any) -> None:
    for dtype, precision in ((torch.float32, "tf32"), (torch.bfloat16, "bfloat16")):
        layer, x, dy = _linear_pair(te, dtype)
        got, want = _run_linear(layer, x, dy), _torch_linear(layer, x, dy)
        for key in got:
            _record(f"te.Linear {str(dtype)[6:]} {key}", precision, got[key], want[key])


def check_norms(te: Any) -> None:
    from te_assembly.engines.reference.ops.norms import RMSNorm

    torch.manual_seed(1)
    norm = te.LayerNorm(256, eps=1e-5, dtype=torch.float32, device=DEVICE)
    x = torch.randn(64, 256, device=DEVICE, requires_grad=True)
    xr = x.detach().clone().requires_grad_(True)
    dy = torch.randn(64, 256, device=DEVICE)
    y = norm(x)
    yr = torch.nn.functional.layer_norm(xr, (256,), norm.weight.detach(), norm.bias.detach(), 1e-5)
    y.backward(dy)
    yr.backward(dy)
    # No GEMM here: TE's norm kernels compute in float32, so the float32 class applies.
    _record("te.LayerNorm float32 y", "float32", y.detach(), yr.detach())
    _record("te.LayerNorm float32 dx", "float32", x.grad, xr.grad)
    # TE's RMSNorm kernel in bfloat16 against our reference op, which computes in float32 and rounds
    # once as TE does: this is what keeps MoE routing choices equal between the engines.
    rms = te.RMSNorm(256, eps=1e-5, dtype=torch.bfloat16, device=DEVICE)
    ref = RMSNorm(256, eps=1e-5, device=DEVICE, dtype=torch.bfloat16)
    xb = torch.randn(64, 256, device=DEVICE, dtype=torch.bfloat16)
    got = rms(xb).detach()
    want, _ = ref(xb)
    _record("te.RMSNorm bfloat16 y vs reference RMSNorm", "bfloat16", got, want.detach())
    ulps = (got.float() != want.float()).float().mean().item()
    RESULTS[-1].note = f"{100 * ulps:.2f}% of elements differ at all"


def check_channelled_ops(te: Any) -> None:
    """x -> tap(residual) -> ops.Linear -> + residual: TE's fuser, channel and GEMM together."""
    torch.manual_seed(2)
    ops = te.ops
    tap = ops.MakeExtraOutput().set_extra_output_channel(0, "residual", output_to_caller=False)
    linear = ops.Linear(128, 128, device=DEVICE, dtype=torch.float32)
    add = ops.AddExtraInput().set_extra_input_channel(0, "residual")
    block = ops.Sequential(tap, linear, add)
    x = torch.randn(32, 128, device=DEVICE, requires_grad=True)
    xr = x.detach().clone().requires_grad_(True)
    y = block(x)
    yr = torch.nn.functional.linear(xr, linear.weight.detach(), linear.bias.detach()) + xr
    dy = torch.randn_like(y)
    y.backward(dy)
    yr.backward(dy)
    _record("te.ops channelled residual y", "tf32", y.detach(), yr.detach())
    _record("te.ops channelled residual dx", "tf32", x.grad, xr.grad)


def recipe_objects() -> dict[str, tuple[dict[str, Any], Any]]:
    """Each FP8 recipe as (config, TE recipe object), or with None when this GPU cannot run it."""
    from te_assembly.analysis.recipes import load_recipe
    from te_assembly.engines.te.recipe import check_recipe_supported, to_te_recipe
    from te_assembly.errors import UnsupportedRecipeError

    out = {}
    capability = torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)
    for name in FP8_RECIPES:
        cfg = load_recipe(name)
        try:
            check_recipe_supported(cfg, capability, torch.version.cuda)
            out[name] = (cfg, to_te_recipe(cfg))
        except UnsupportedRecipeError as exc:
            print(f"[gpu_sanity] {name}: not run here ({exc})")
            out[name] = (cfg, None)
    return out


def check_recipes(te: Any) -> None:
    """te.Linear under each FP8 recipe: close to torch within fp8 tolerance, and not bfloat16's output."""
    layer, x, dy = _linear_pair(te, torch.bfloat16)
    want = _torch_linear(layer, x, dy)
    plain = _run_linear(layer, x, dy)
    noise = (plain["y"].double() - want["y"].double()).abs().max().item()
    for name, (_cfg, te_recipe) in recipe_objects().items():
        if te_recipe is None:
            continue
        # A fresh layer per recipe (same seed, same weights): TE keeps quantization state per module.
        layer, _, _ = _linear_pair(te, torch.bfloat16)
        got = _run_linear(layer, x, dy, te.autocast(enabled=True, recipe=te_recipe))
        for key in got:
            _record(f"te.Linear {name} {key}", "fp8", got[key], want[key])
        shift = (got["y"].double() - plain["y"].double()).abs().max().item()
        active = shift > 4 * noise and shift > 1e-3 * want["y"].abs().max().item()
        RESULTS.append(
            Result(
                f"{name} is active (output moved off bfloat16)",
                "fp8",
                shift,
                noise,
                4 * noise,
                active,
                f"|fp8 - bf16| {shift:.3e} vs bf16 noise {noise:.3e}",
            )
        )
        print(
            f"[gpu_sanity] {'ok  ' if active else 'FAIL'} {name} active: |y_{name} - y_bf16| "
            f"{shift:.3e} vs bf16 noise {noise:.3e}",
            flush=True,
        )


CHECKS: tuple[Callable[[Any], None], ...] = (check_linear, check_norms, check_channelled_ops, check_recipes)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=("check",))
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--dry-run", action="store_true", help="stop before the first CUDA call")
    args = parser.parse_args()
    for precision in ("tf32", "bfloat16", "float32", "fp8"):
        assert precision in TOLERANCES, precision
    if args.dry_run:
        planned = [c.__name__ for c in CHECKS]
        print(
            f"[gpu_sanity] dry run: would run {', '.join(planned)}; tolerances "
            + ", ".join(f"{k}={v.rtol:g}" for k, v in TOLERANCES.items())
        )
        if args.json:
            args.json.write_text(json.dumps({"dry_run": True, "checks": planned}, indent=2))
        return 0
    if not torch.cuda.is_available():
        print("[gpu_sanity] FAIL: no CUDA GPU visible", file=sys.stderr)
        return 1
    import transformer_engine
    import transformer_engine.pytorch as te

    cap = torch.cuda.get_device_capability()
    print(
        f"[gpu_sanity] TE {transformer_engine.__version__}, torch {torch.__version__} (CUDA "
        f"{torch.version.cuda}), {torch.cuda.get_device_name()} sm_{cap[0]}{cap[1]}",
        flush=True,
    )
    crashed = []
    for check in CHECKS:
        try:
            check(te)
        except Exception as exc:  # one broken kernel must not hide the others' results
            crashed.append(f"{check.__name__}: {type(exc).__name__}: {exc}")
            print(f"[gpu_sanity] FAIL {check.__name__} raised {type(exc).__name__}: {exc}", flush=True)
    passed = not crashed and all(r.passed for r in RESULTS)
    if args.json:
        payload = {"passed": passed, "results": [asdict(r) for r in RESULTS], "crashed": crashed}
        args.json.write_text(json.dumps(payload, indent=2))
    print(f"[gpu_sanity] {'all kernel checks passed' if passed else 'FAILED'}", flush=True)
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
