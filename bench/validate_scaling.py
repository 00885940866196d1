"""How config validation scales, end to end and in the library, against TE's own fuser construction.

    python bench/validate_scaling.py [--sizes 1000 10000] [--repeats 3] [--no-te]

Three measurements, in one run:

1. CLI: ``python -m te_assembly validate -cd DIR model=genN`` in a fresh process, wall time, for generated
   models written as YAML to a user folder DIR (the way a user keeps their own models). Goals: under 1 s
   at 1,000 ops and under 3 s at 10,000 ops on the 2-core CPU machine kind.
2. Library: parse the YAML (``config/source.py``), then resolve and analyze it to a plan
   (``config/resolved.py``, ``validate/analysis.py``), in this process; seconds and microseconds per op.
3. TE: for a model of the ops TE constructs on CPU (MakeExtraOutput, Bias, ConstantScale, Identity,
   AddExtraInput, channels between them), the library's parse -> plan next to TE's own construction of
   the same ops, the channel setter calls and ``OperationFuser`` construction; their ratio. Skipped,
   with the reason, when Transformer Engine does not import.

The generated models repeat realistic blocks (pre-norm SwiGLU MLP with a residual channel, every fourth
block a top-k MoE block with router/dispatch/combine channels) with an ``Identity`` module splitting the
fusers every 50 blocks. Times are the best of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

# Run from a checkout without installing: the package sits next to bench/.
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from te_assembly.analysis import analyze_resolved  # noqa: E402
from te_assembly.analysis.plan import Plan  # noqa: E402
from te_assembly.config.resolved import resolve_source  # noqa: E402
from te_assembly.config.source import parse_text  # noqa: E402

HIDDEN, FFN, EXPERTS, TOP_K = 64, 128, 4, 2
HIDDEN_OUT = {"public": False}
GOALS = {1_000: 1.0, 10_000: 3.0}
"""CLI validate wall-time goals (seconds) from issue 9."""


# ----------------------------------------------------------------------------------------- models


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


def _cpu_block(b: int) -> list[dict[str, Any]]:
    """Ops TE constructs (and runs) on CPU, with a hidden channel and a fan-out."""
    res = f"c{b}"
    return [
        _tap(b, res),
        {"name": f"b{b}_bias", "op": "Bias", "args": {"size": HIDDEN}},
        {"name": f"b{b}_scale", "op": "ConstantScale", "args": {"scale": 0.5}},
        {"name": f"b{b}_id", "op": "Identity"},
        {"name": f"b{b}_add", "op": "AddExtraInput", "extra_inputs": {"addend": res}},
        {"name": f"b{b}_add2", "op": "AddExtraInput", "extra_inputs": {"addend": res}},
    ]


def generate(num_ops: int, cpu_only: bool = False) -> dict[str, Any]:
    """A valid model of exactly ``num_ops`` steps (the last block is cut short by a bias chain)."""
    ops: list[dict[str, Any]] = []
    b = 0
    while True:
        if cpu_only:
            block = _cpu_block(b)
        else:
            block = _moe_block(b) if b % 4 == 3 else _mlp_block(b)
        if b % 50 == 49:
            block.append({"name": f"b{b}_split", "module": "Identity"})
        if len(ops) + len(block) > num_ops:
            break
        ops.extend(block)
        b += 1
    tail = range(num_ops - len(ops))
    ops.extend({"name": f"tail{i}", "op": "Bias", "args": {"size": HIDDEN}} for i in tail)
    name = f"{'cpu' if cpu_only else 'gen'}{num_ops}"
    return {"name": name, "in_features": HIDDEN, "dims": {"hidden": HIDDEN}, "ops": ops}


# ----------------------------------------------------------------------------------------- timing


def best_time(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def cli_seconds(folder: Path, name: str, repeats: int) -> tuple[float, int]:
    """Wall time of ``validate`` in a fresh process, run from the user's folder."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-m", "te_assembly", "validate", "-cd", str(folder), f"model={name}"]
    code = 0

    def run() -> None:
        nonlocal code
        code = subprocess.run(command, cwd=folder, env=env, capture_output=True, check=False).returncode

    return best_time(run, repeats), code


def library_seconds(text: str, repeats: int) -> tuple[float, float, Plan | None]:
    """(parse seconds, resolve+analyze seconds, plan) for YAML text, in this process."""
    holder: dict[str, Any] = {}

    def parse() -> None:
        holder["source"] = parse_text(text, "gen.yaml", "model", "model")

    def analyze() -> None:
        holder["analysis"] = analyze_resolved(resolve_source(holder["source"]))

    parse_s = best_time(parse, repeats)
    analyze_s = best_time(analyze, repeats)
    return parse_s, analyze_s, holder["analysis"].plan


def te_import_problem() -> str | None:
    try:
        import torch  # noqa: F401  - TE's core library needs torch's libnccl loaded first
        import transformer_engine.pytorch  # noqa: F401
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def te_seconds(plan: Plan, repeats: int) -> tuple[float, float, float]:
    """TE's own work for the plan's ops: (construct, bind channels, OperationFuser) seconds, best of
    ``repeats`` (each repeat makes fresh ops: TE locks an op once a fuser captures it)."""
    import torch
    from transformer_engine.pytorch.ops.fuser import OperationFuser

    from te_assembly.catalog import OPS, load_object
    from te_assembly.engines.te.bindings import binding_calls

    calls = binding_calls(plan)
    best = (float("inf"), float("inf"), float("inf"))
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        ops = {}
        for step in plan.steps:
            if step.kind == "op":
                cls = load_object(OPS[step.type].te_class or "")
                extra = {"device": torch.device("cpu")} if step.type == "Bias" else {}
                ops[step.name] = cls(**step.args, **extra)
        t1 = time.perf_counter()
        for call in calls:
            call.apply(ops[call.step])
        t2 = time.perf_counter()
        for group in plan.fusers:
            OperationFuser([ops[plan.steps_by_index[i].name] for i in group.steps])
        t3 = time.perf_counter()
        if t3 - t0 < sum(best):
            best = (t1 - t0, t2 - t1, t3 - t2)
    return best


# ----------------------------------------------------------------------------------------- report


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
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-te", action="store_true", help="skip the TE comparison")
    args = parser.parse_args()
    console = Console(highlight=False, width=160)
    console.print(
        f"Python {platform.python_version()} on {platform.system()} {platform.machine()}; CPU: {cpu_name()} "
        f"({os.cpu_count()} logical cores); load average {os.getloadavg()[0]:.2f} (other work on the "
        f"machine skews the numbers); best of {args.repeats}",
        markup=False,
    )
    with tempfile.TemporaryDirectory(prefix="te_assembly-user-") as tmp:
        folder = Path(tmp)
        (folder / "model").mkdir()
        cli = Table(title="validate: CLI (fresh process, user folder) and library, realistic MLP/MoE models")
        for col in ("ops", "CLI s", "goal", "parse s", "parsed -> plan s", "µs/op", "CLI / library"):
            cli.add_column(col, justify="right")
        for n in args.sizes:
            model = generate(n)
            text = yaml.safe_dump(model, sort_keys=False)
            (folder / "model" / f"{model['name']}.yaml").write_text(text)
            parse_s, analyze_s, plan = library_seconds(text, args.repeats)
            if plan is None:
                console.print(f"generated model {model['name']} is not valid", style="red")
                return 1
            cli_s, code = cli_seconds(folder, str(model["name"]), args.repeats)
            goal = GOALS.get(n)
            verdict = "met" if cli_s < (goal or 0) and code == 0 else "MISSED"
            lib = parse_s + analyze_s
            cli.add_row(
                f"{n:,}",
                f"{cli_s:.2f}",
                "-" if goal is None else f"< {goal:g} s: {verdict}",
                f"{parse_s:.3f}",
                f"{analyze_s:.3f}",
                f"{lib / n * 1e6:.1f}",
                f"{cli_s / lib:.1f}",
            )
        console.print(cli)
    if args.no_te:
        return 0
    problem = te_import_problem()
    if problem is not None:
        console.print(f"TE comparison skipped: transformer_engine.pytorch does not import ({problem})")
        return 0
    te = Table(
        title="parsed YAML -> plan vs TE's own construct + bind + OperationFuser, same ops (TE's CPU ops)"
    )
    columns = (
        "ops",
        "parse s",
        "parsed -> plan s",
        "TE construct s",
        "TE bind s",
        "TE fuser s",
        "TE total s",
    )
    for col in (*columns, "plan / TE", "parse+plan / TE"):
        te.add_column(col, justify="right")
    for n in args.sizes:
        text = yaml.safe_dump(generate(n, cpu_only=True), sort_keys=False)
        parse_s, analyze_s, plan = library_seconds(text, args.repeats)
        assert plan is not None
        construct, bind, fuse = te_seconds(plan, args.repeats)
        total = construct + bind + fuse
        te.add_row(
            f"{n:,}",
            f"{parse_s:.3f}",
            f"{analyze_s:.3f}",
            f"{construct:.3f}",
            f"{bind:.3f}",
            f"{fuse:.3f}",
            f"{total:.3f}",
            f"{analyze_s / total:.2f}",
            f"{(parse_s + analyze_s) / total:.2f}",
        )
    console.print(te)
    return 0


if __name__ == "__main__":
    sys.exit(main())
