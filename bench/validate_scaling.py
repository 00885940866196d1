"""How config validation scales with model size: ``analyze`` on generated models of 1k, 10k, 100k ops.

    python bench/validate_scaling.py [--sizes 1000 10000 100000] [--load]

Models repeat realistic blocks (pre-norm SwiGLU MLP with a residual channel, and every fourth block a
top-k MoE block with router/dispatch/combine channels), with an ``Identity`` module splitting the
fusers every 50 blocks. Reports best-of-3 seconds (one run at 100k ops and above), microseconds per op,
and the per-op cost relative to the smallest size: linear growth keeps that ratio near 1.
``--load`` also times ``load_model_text`` (YAML parse, OmegaConf, line map) on the same model as YAML.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

# Run from a checkout without installing: the package sits next to bench/.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from te_assembly.config import load_model_text
from te_assembly.validate import analyze

HIDDEN, FFN, EXPERTS, TOP_K = 64, 128, 4, 2
HIDDEN_OUT = {"public": False}


def _tap(b: int, channel: str) -> dict[str, Any]:
    outputs = {"out": {"channel": channel, **HIDDEN_OUT}}
    return {"name": f"b{b}_tap", "op": "MakeExtraOutput", "extra_outputs": outputs}


def _mlp_block(b: int) -> list[dict[str, Any]]:
    res = f"res{b}"
    return [
        _tap(b, res),
        {"name": f"b{b}_norm", "op": "RMSNorm", "args": {"normalized_shape": HIDDEN}},
        {"name": f"b{b}_up", "op": "Linear", "args": {"in_features": HIDDEN, "out_features": 2 * FFN}},
        {"name": f"b{b}_act", "op": "SwiGLU"},
        {"name": f"b{b}_down", "op": "Linear", "args": {"in_features": FFN, "out_features": HIDDEN}},
        {"name": f"b{b}_add", "op": "AddExtraInput", "extra_inputs": {"addend": res}},
    ]


def _moe_block(b: int) -> list[dict[str, Any]]:
    c = {k: f"b{b}_{k}" for k in ("res", "probs", "map", "split", "rprobs", "rmap", "aux")}
    return [
        _tap(b, c["res"]),
        {"name": f"b{b}_norm", "op": "RMSNorm", "args": {"normalized_shape": HIDDEN}},
        {
            "name": f"b{b}_router",
            "op": "TopKRouter",
            "args": {"in_features": HIDDEN, "num_experts": EXPERTS, "top_k": TOP_K},
            "extra_outputs": {
                "probs": {"channel": c["probs"], **HIDDEN_OUT},
                "routing_map": {"channel": c["map"], **HIDDEN_OUT},
                "aux_loss": {"channel": c["aux"], "public": True},
            },
        },
        {
            "name": f"b{b}_dispatch",
            "op": "Dispatch",
            "args": {"num_experts": EXPERTS, "top_k": TOP_K},
            "extra_inputs": {"probs": c["probs"], "routing_map": c["map"]},
            "extra_outputs": {
                "split_sizes": {"channel": c["split"], **HIDDEN_OUT},
                "row_probs": {"channel": c["rprobs"], **HIDDEN_OUT},
                "row_map": {"channel": c["rmap"], **HIDDEN_OUT},
            },
        },
        {
            "name": f"b{b}_fc1",
            "op": "GroupedLinear",
            "args": {"num_groups": EXPERTS, "in_features": HIDDEN, "out_features": 2 * FFN},
            "extra_inputs": {"split_sizes": c["split"]},
        },
        {"name": f"b{b}_act", "op": "ScaledSwiGLU", "extra_inputs": {"scales": c["rprobs"]}},
        {
            "name": f"b{b}_fc2",
            "op": "GroupedLinear",
            # p * (FC2(h) + b), as configs/model/moe_block.yaml: the bias is scaled by the router probability.
            "args": {"num_groups": EXPERTS, "in_features": FFN, "out_features": HIDDEN, "scale_bias": True},
            "extra_inputs": {"split_sizes": c["split"], "scales": c["rprobs"]},
        },
        {
            "name": f"b{b}_combine",
            "op": "Combine",
            "args": {"top_k": TOP_K},
            "extra_inputs": {"row_map": c["rmap"]},
        },
        {"name": f"b{b}_add", "op": "AddExtraInput", "extra_inputs": {"addend": c["res"]}},
    ]


def generate(num_ops: int) -> dict[str, Any]:
    """A valid model of exactly ``num_ops`` steps (the last block is cut short by a bias chain)."""
    ops: list[dict[str, Any]] = []
    b = 0
    while True:
        block = _moe_block(b) if b % 4 == 3 else _mlp_block(b)
        if b % 50 == 49:
            block.append({"name": f"b{b}_split", "module": "Identity"})
        if len(ops) + len(block) > num_ops:
            break
        ops.extend(block)
        b += 1
    tail = range(num_ops - len(ops))
    ops.extend({"name": f"tail{i}", "op": "Bias", "args": {"size": HIDDEN}} for i in tail)
    return {"name": f"gen{num_ops}", "in_features": HIDDEN, "dims": {"hidden": HIDDEN}, "ops": ops}


def best_time(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--load", action="store_true", help="also time load_model_text on the YAML text")
    args = parser.parse_args()
    console = Console(highlight=False)
    console.print(
        f"Python {platform.python_version()} ({platform.python_implementation()}) on {platform.system()} "
        f"{platform.machine()}; CPU: {cpu_name()} ({os.cpu_count()} logical cores); "
        f"load average {os.getloadavg()[0]:.2f} (other work on the machine skews the numbers)",
        markup=False,
    )

    table = Table(title="te_assembly.validate.analyze scaling")
    for col in ("ops", "runs", "seconds", "µs/op", "per-op ratio to first", "channels", "fusers"):
        table.add_column(col, justify="right")
    if args.load:
        table.add_column("load s", justify="right")
    base: float | None = None
    for n in args.sizes:
        model = generate(n)
        diags, plan = analyze(model)  # warm-up, and a check that the generated model is valid
        if plan is None:
            console.print("\n".join(d.format() for d in diags if d.is_error)[:2000], markup=False)
            return 1
        repeats = 1 if n >= 100_000 else 3
        seconds = best_time(lambda m=model: analyze(m), repeats)
        per_op = seconds / n * 1e6
        base = base or per_op
        row = [
            f"{n:,}",
            str(repeats),
            f"{seconds:.3f}",
            f"{per_op:.1f}",
            f"{per_op / base:.2f}",
            f"{len(plan.channels):,}",
            f"{len(plan.fusers):,}",
        ]
        if args.load:
            text = yaml.safe_dump(model, sort_keys=False)
            row.append(f"{best_time(lambda t=text: load_model_text(t, 'gen.yaml'), 1):.2f}")
        table.add_row(*row)
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
