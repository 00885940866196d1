"""The measuring steps of scripts/gpu_check.sh, each writing one JSON file, and the summary that joins them.

  python scripts/gpu_report.py facts   --json F [--dry-run]   machine, torch, CUDA, GPU, TE version
  python scripts/gpu_report.py verify  --json F [--dry-run]   ``verify`` of the shipped models under bf16,
                                                              float32 (TF32) and every shipped recipe
  python scripts/gpu_report.py bench   --json F [--dry-run]   tokens/s and TFLOP/s of the TE engine
  python scripts/gpu_report.py summary --state DIR --out F    one JSON with everything above + step times

Every (model, recipe) cell is reported, none is silently dropped: ``pass``/``fail``, ``unsupported`` (the
GPU cannot run the recipe: MXFP8 and NVFP4 need sm_100, this is not a failure), or ``error`` with the
exception. A recipe cell also records the recipe's effect (``te_assembly.jobs.verify.recipe_effect``): that
its output moved off bfloat16 by more than bfloat16 noise. ``--dry-run`` does everything up to the
first CUDA call: composes and validates every configuration and checks it against its recipe's shape
rules, so a config mistake shows here on CPU, not on the GPU machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from te_assembly.analysis.settings import RunSettings
from te_assembly.engines.target import Target

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DEVICE = "cuda"
KERNELS = "te"
"""Where verify and bench run (a CPU smoke test points these at ``cpu`` and ``reference``)."""

TOKENS = 256
"""Tokens per verify call: a multiple of 128, so every recipe's token-row rule holds."""
WIDE = ("model.dims.hidden=128", "model.dims.ffn=256")
"""residual_mlp widened for FP8 block scaling (every GEMM dimension a multiple of 128)."""


@dataclass(frozen=True)
class Cell:
    model: str
    recipe: str
    dtype: str = "bfloat16"
    overrides: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        extra = f" [{' '.join(self.overrides)}]" if self.overrides else ""
        return f"{self.model} {self.recipe} {self.dtype}{extra}"


VERIFY_GRID: tuple[Cell, ...] = (
    Cell("residual_mlp", "bf16", "float32"),  # TF32: float32 through TE's GEMMs
    Cell("moe_block", "bf16", "float32"),
    Cell("residual_mlp", "bf16"),
    Cell("moe_block", "bf16"),
    Cell("moe_block_wide", "bf16"),
    Cell("residual_mlp", "fp8_delayed"),
    Cell("moe_block", "fp8_delayed"),
    Cell("residual_mlp", "fp8_current"),
    Cell("moe_block", "fp8_current"),
    Cell("moe_block_wide", "fp8_current"),
    Cell("residual_mlp", "fp8_block", overrides=WIDE),
    Cell("moe_block_wide", "fp8_block"),
    Cell("residual_mlp", "mxfp8"),
    Cell("moe_block_wide", "mxfp8"),
    Cell("residual_mlp", "nvfp4"),
    Cell("moe_block_wide", "nvfp4"),
    Cell("moe_transformer", "bf16"),  # TE's DotProductAttention and fused RoPE, rerouted residuals
    Cell("dense_transformer", "bf16"),
)
"""What the GPU check verifies. Each cell satisfies its recipe's shape rules (checked in the dry run)."""

BIG_MOE = ("model.dims.hidden=1024", "model.dims.ffn=2816", "model.dims.experts=8", "model.dims.align=128")
BIG_MLP = ("model.dims.hidden=1024", "model.dims.ffn=4096")


@dataclass(frozen=True)
class BenchCell:
    cell: Cell
    tokens: int
    compare: bool = False


BENCH_GRID: tuple[BenchCell, ...] = (
    BenchCell(Cell("moe_block", "bf16"), 1024),  # the shipped block at bench's default size
    BenchCell(Cell("moe_block", "bf16", overrides=BIG_MOE), 8192, compare=True),
    BenchCell(Cell("moe_block", "fp8_current", overrides=BIG_MOE), 8192),
    BenchCell(Cell("residual_mlp", "bf16", overrides=BIG_MLP), 8192),
    BenchCell(Cell("residual_mlp", "fp8_current", overrides=BIG_MLP), 8192),
)
"""What the GPU check times (TE engine, TE kernels). The 1024-wide cells are large enough for the GPU's
throughput to show; the shipped 64-wide block is launch-bound."""


def _plan_and_recipe(cell: Cell) -> tuple[Any, Mapping[str, Any]]:
    """Compose and validate the cell's model and recipe as the CLI does (``te_assembly.load``: the
    recipe's shape rules included); ConfigError with every problem."""
    from te_assembly import load
    from te_assembly.errors import ConfigError

    analysis = load(cell.model, [f"recipe={cell.recipe}", *cell.overrides])
    if analysis.plan is None or analysis.recipe is None:
        raise ConfigError(list(analysis.diagnostics), summary=f"{cell.label}: does not fit its recipe")
    return analysis.plan, analysis.recipe


def _unsupported(recipe: Mapping[str, Any]) -> str | None:
    """Why this GPU cannot run the recipe, or None."""
    import torch

    from te_assembly.engines.te.recipe import check_recipe_supported
    from te_assembly.errors import UnsupportedRecipeError

    try:
        check_recipe_supported(recipe, torch.cuda.get_device_capability(), torch.version.cuda)
    except UnsupportedRecipeError as exc:
        return str(exc)
    return None


def _dtype(name: str) -> Any:
    import torch

    return {"bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}[name]


def _error(exc: BaseException) -> dict[str, Any]:
    return {
        "status": "error",
        "error": f"{type(exc).__name__}: {exc}",
        "traceback": traceback.format_exc(limit=6),
    }


def verify_cell(cell: Cell) -> dict[str, Any]:
    from te_assembly.jobs.verify import recipe_effect, verify

    plan, recipe = _plan_and_recipe(cell)
    reason = _unsupported(recipe)
    if reason is not None:
        return {"status": "unsupported", "reason": reason}
    quantizes = recipe.get("kind") != "none"
    report = verify(
        plan,
        Target.of(
            "te",
            kernels=KERNELS,
            device=DEVICE,
            dtype=_dtype(cell.dtype),
            recipe=recipe if quantizes else None,
            seed=0,
        ),
        RunSettings(tokens=TOKENS),
    )
    tol = report.tolerance
    floats = [
        c for c in report.comparisons if not c.exact and c.max_rel != float("inf")
    ] or report.comparisons
    worst = max(floats, key=lambda c: c.max_rel)
    out: dict[str, Any] = {
        "status": "pass" if report.passed else "fail",
        "precision": report.precision,
        "tolerance": asdict(tol),
        "tensors": len(report.comparisons),
        "failures": [
            {"tensor": c.name, "max_abs": c.max_abs, "max_rel": c.max_rel, "note": c.note}
            for c in report.failures
        ],
        "worst_tensor": worst.name,
        "worst_max_rel": worst.max_rel,
    }
    if quantizes:
        effect = recipe_effect(plan, Target.of("te", device=DEVICE), recipe, tokens=TOKENS)
        out["recipe_effect"] = {**asdict(effect), "active": effect.active}
        if not effect.active:
            out["status"] = "fail"
            out["failures"].append({"tensor": "recipe active", "note": "output did not move off bfloat16"})
    return out


def cpu_cell(cell: Cell) -> dict[str, Any]:
    """The dry run's part of a cell: compose and validate it and, where TE imports, ``verify`` it on CPU
    with ``kernels=reference`` in float64 (TE's fuser and channels with this Python and torch). A
    mismatch there raises, so the cell reports an error."""
    from te_assembly.engines import te_available
    from te_assembly.jobs.verify import verify

    plan, _ = _plan_and_recipe(cell)
    if not te_available():
        return {"cpu_reference_kernels": "TE not importable here"}
    key = (cell.model, cell.overrides)  # the recipe plays no part with kernels=reference: once per model
    if key not in _CPU_DONE:
        import torch

        report = verify(
            plan,
            Target.of("te", kernels="reference", device="cpu", dtype=torch.float64),
            RunSettings(tokens=TOKENS),
        )
        if not report.passed:
            names = ", ".join(c.name for c in report.failures)
            raise AssertionError(f"kernels=reference on CPU: {names} differ from the reference engine")
        _CPU_DONE[key] = f"pass ({len(report.comparisons)} tensors, float64)"
    return {"cpu_reference_kernels": _CPU_DONE[key]}


_CPU_DONE: dict[tuple[str, tuple[str, ...]], str] = {}


def _verify(dry_run: bool) -> dict[str, Any]:
    rows = []
    for cell in VERIFY_GRID:
        start = time.perf_counter()
        row: dict[str, Any] = {**asdict(cell), "label": cell.label}
        try:
            if dry_run:
                row.update(status="dry-run", **cpu_cell(cell))
            else:
                row.update(verify_cell(cell))
        except Exception as exc:  # one broken cell must not hide the others
            row.update(_error(exc))
        row["seconds"] = round(time.perf_counter() - start, 2)
        print(
            f"[gpu_report] verify {cell.label}: {row['status']}"
            + (
                f" ({row.get('reason') or row.get('error')})"
                if row["status"] in ("unsupported", "error")
                else ""
            ),
            flush=True,
        )
        rows.append(row)
    failed = [r["label"] for r in rows if r["status"] in ("fail", "error")]
    return {"cells": rows, "failed": failed, "passed": not failed}


def bench_cell(bc: BenchCell) -> dict[str, Any]:
    import torch

    from te_assembly.engines.data import sample_public_inputs, sample_x
    from te_assembly.jobs.bench import PHASES, build_variants, forward_flops, peak_tflops, run_benchmark

    plan, recipe = _plan_and_recipe(bc.cell)
    reason = _unsupported(recipe)
    if reason is not None:
        return {"status": "unsupported", "reason": reason}
    device, dtype = torch.device(DEVICE), _dtype(bc.cell.dtype)
    torch.manual_seed(0)
    variants, _ = build_variants(
        plan,
        Target.of(
            "te",
            kernels=KERNELS,
            device=device,
            dtype=dtype,
            recipe=recipe if recipe.get("kind") != "none" else None,
        ),
        optimizer="adamw",
        lr=1e-3,
        compare=bc.compare,
    )
    gen = torch.Generator().manual_seed(0)
    x = sample_x(plan, bc.tokens, generator=gen, device=device, dtype=dtype)
    inputs = sample_public_inputs(plan, bc.tokens, generator=gen, device=device, dtype=dtype)
    results = run_benchmark(variants, x, inputs, device=device, warmup=3, repeats=10)
    # What TE's fusers fused, next to the prediction for this GPU (analysis/fusions.py).
    from te_assembly.analysis.fusions import FusionTarget
    from te_assembly.jobs.bench.fused import fired_fusions

    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    kind = recipe.get("kind") if recipe.get("kind") != "none" else None
    dtype_name = str(dtype).removeprefix("torch.")
    target = FusionTarget(
        "gpu", capability, kind, recipe.get("backward_override"), dtype_name, env=dict(os.environ)
    )
    fusions = fired_fusions(plan, variants[0].model, target)
    flops = forward_flops(plan, bc.tokens)
    peak = peak_tflops(device, dtype, tf32=True)
    factor = {"forward": 1, "backward": 2, "step": 3}
    out_variants = []
    for r in results:
        phases = {}
        for phase in PHASES:
            s = r.stats[phase]
            achieved = factor[phase] * flops / s.median / 1e12
            phases[phase] = {
                "median_ms": s.median * 1e3,
                "iqr_ms": s.iqr * 1e3,
                "tokens_per_s": bc.tokens / s.median,
                "tflops": achieved,
                "pct_of_peak": (100 * achieved / peak) if peak else None,
            }
        out_variants.append(
            {
                "variant": r.name,
                "phases": phases,
                "peak_mib": (r.peak_bytes or 0) / 2**20 if r.peak_bytes is not None else None,
            }
        )
    return {
        "status": "ok",
        "tokens": bc.tokens,
        "forward_gemm_flops": flops,
        "peak_tflops": peak,
        "peak_note": "dense bf16 peak (TF32 for float32); FP8 recipes are measured against it too",
        "variants": out_variants,
        "fusions": fusions,
    }


def _bench(dry_run: bool) -> dict[str, Any]:
    rows = []
    for bc in BENCH_GRID:
        start = time.perf_counter()
        row: dict[str, Any] = {
            **asdict(bc.cell),
            "label": bc.cell.label,
            "tokens": bc.tokens,
            "compare": bc.compare,
        }
        try:
            if dry_run:
                _plan_and_recipe(bc.cell)
                row.update(status="dry-run")
            else:
                row.update(bench_cell(bc))
        except Exception as exc:
            row.update(_error(exc))
        row["seconds"] = round(time.perf_counter() - start, 2)
        line = row["status"]
        if row["status"] == "ok":
            step = row["variants"][0]["phases"]["step"]
            line = (
                f"step {step['median_ms']:.3f} ms, {step['tokens_per_s']:,.0f} tokens/s, "
                f"{step['tflops']:.1f} TFLOP/s"
            )
        print(f"[gpu_report] bench {bc.cell.label} tokens={bc.tokens}: {line}", flush=True)
        rows.append(row)
    return {"cells": rows, "passed": all(r["status"] in ("ok", "unsupported", "dry-run") for r in rows)}


def _run(cmd: Sequence[str]) -> str | None:
    try:
        return (
            subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False).stdout.strip()
            or None
        )
    except (OSError, subprocess.TimeoutExpired):
        return None


def _facts(dry_run: bool) -> dict[str, Any]:
    import torch

    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cpus": os.cpu_count(),
        "nvidia_smi": _run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
        ),
    }
    if not dry_run:
        cap = torch.cuda.get_device_capability()
        facts.update(
            gpu=torch.cuda.get_device_name(),
            capability=f"sm_{cap[0]}{cap[1]}",
            gpu_count=torch.cuda.device_count(),
        )
    print("[gpu_report] " + ", ".join(f"{k}={v}" for k, v in facts.items()), flush=True)
    return facts


STEPS: dict[str, Callable[[bool], dict[str, Any]]] = {"facts": _facts, "verify": _verify, "bench": _bench}


def summary(state: Path, out: Path) -> dict[str, Any]:
    """Join every step's JSON in ``state`` (``<step>.json``) and the step log (``steps.tsv``: name,
    status, seconds) into one document."""
    doc: dict[str, Any] = {"generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    for path in sorted(state.glob("*.json")):
        try:
            doc[path.stem] = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            doc[path.stem] = {"unreadable": str(exc)}
    steps = []
    log = state / "steps.tsv"
    if log.is_file():
        for line in log.read_text().splitlines():
            name, status, seconds, *note = line.split("\t")
            steps.append({"step": name, "status": status, "seconds": float(seconds), "note": " ".join(note)})
    doc["steps"] = steps
    junit = state / "pytest-gpu.xml"
    if junit.is_file():
        doc["pytest"] = pytest_results(junit)
    collected = state / "pytest-collect.txt"
    if collected.is_file():
        ids = [line for line in collected.read_text().splitlines() if "::" in line]
        doc["pytest"] = {"collected": len(ids), "tests": ids}
    out.write_text(json.dumps(doc, indent=2, default=str))
    return doc


def pytest_results(junit: Path) -> dict[str, Any]:
    """Counts and the failed/skipped test ids from pytest's JUnit XML."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(junit).getroot()
    except ET.ParseError as exc:
        return {"unreadable": str(exc)}
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failed, skipped = [], []
    for case in root.iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
            failed.append(test_id)
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
            node = case.find("skipped")
            skipped.append(f"{test_id}: {node.get('message') if node is not None else ''}")
        else:
            counts["passed"] += 1
    return {**counts, "failed_tests": failed, "skipped_tests": skipped}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("step", choices=(*STEPS, "summary"))
    parser.add_argument("--json", type=Path, help="where a step writes its result")
    parser.add_argument("--dry-run", action="store_true", help="stop before the first CUDA call")
    parser.add_argument("--state", type=Path, help="summary: the folder of step results")
    parser.add_argument("--out", type=Path, help="summary: the file to write")
    args = parser.parse_args(argv)
    if args.step == "summary":
        if args.state is None or args.out is None:
            parser.error("summary needs --state and --out")
        summary(args.state, args.out)
        return 0
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            print(
                "[gpu_report] no CUDA GPU visible (use --dry-run on a machine without one)", file=sys.stderr
            )
            return 1
    result = {"dry_run": args.dry_run, **STEPS[args.step](args.dry_run)}
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return 0 if result.get("passed", True) else 1


if __name__ == "__main__":
    raise SystemExit(main())
