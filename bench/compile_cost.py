"""What ``compile=true`` costs and gives on the reference engine: the first forward+backward (tracing
and code generation) and the later ones, eager against compiled, side by side in one run.

Three fresh processes build the same model (same seed) and time one forward+backward of the same batch
repeatedly: eager; compiled with an empty inductor cache (a cold start: a new machine, a new model);
compiled again on that cache (torch keeps generated code on disk, ``TORCHINDUCTOR_CACHE_DIR``, so a
second run of a model starts warm). The table gives the first call and the median of the later calls,
each also as a ratio to eager's later calls.

    python bench/compile_cost.py                      # the README's table
    python bench/compile_cost.py --model residual_mlp --tokens 4096
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def worker(model_name: str, batch: int, seq: int, compile_: bool, repeats: int) -> dict[str, float]:
    import torch

    import te_assembly

    torch.manual_seed(0)
    model = te_assembly.build(model_name, "reference")
    if compile_:
        model.configure(compile=True)
    plan = model.plan
    torch.manual_seed(1)
    if plan.takes_token_ids:
        x = torch.randint(0, plan.in_features, (batch, seq))
    elif plan.takes_sequences:
        x = torch.randn(batch, seq, plan.in_features)
    else:
        x = torch.randn(batch * seq, plan.in_features)

    def call() -> float:
        began = time.perf_counter()
        y, _ = model(x)
        y.float().square().mean().backward()
        return time.perf_counter() - began

    first = call()
    later = [call() for _ in range(repeats)]
    return {"first_s": first, "later_s": statistics.median(later)}


def _run(args: argparse.Namespace, compile_: bool, cache: Path) -> dict[str, float]:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    command = [
        sys.executable,
        __file__,
        "--worker",
        f"--model={args.model}",
        f"--batch={args.batch}",
        f"--seq={args.seq}",
        f"--repeats={args.repeats}",
        *(["--compile"] if compile_ else []),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"worker failed:\n{done.stderr[-3000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--model", default="dense_transformer")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.model, args.batch, args.seq, args.compile, args.repeats)))
        return
    with tempfile.TemporaryDirectory() as folder:
        cache = Path(folder) / "inductor"
        rows = [
            ("eager", _run(args, False, cache)),
            ("compiled, empty cache", _run(args, True, cache)),
            ("compiled, warm cache", _run(args, True, cache)),
        ]
    base = rows[0][1]["later_s"]
    print(f"{args.model}, batch {args.batch} x {args.seq}, forward+backward, float32, reference engine")
    print(f"{'':24} {'first call s':>12} {'x eager':>9} {'later calls ms':>15} {'x eager':>8}")
    for name, r in rows:
        print(
            f"{name:24} {r['first_s']:12.2f} {r['first_s'] / base:9.0f} {r['later_s'] * 1e3:15.2f} "
            f"{r['later_s'] / base:8.2f}"
        )


if __name__ == "__main__":
    main()
