"""One process vs two under torchrun: job tokens/s and the share of each step spent in collectives.

For each (model, layout) it runs ``python -m te_assembly bench`` once in one process and once under
``torchrun --standalone --nproc_per_node=2`` with the same global batch (``bench.tokens`` rows per step in
all), reads the JSON each writes (``bench.report``), and prints one row per layout: the two-process job's
tokens/s as a ratio to the one-process run's, each rank's share of a step spent in collectives, and the
one-process time of a step. Rounds alternate the order (1 then 2 processes, then 2 then 1) and the
median over rounds is reported, so a drift of the machine hits both alike.

    python bench/parallel_scaling.py [--rounds 2] [--tokens 2048] [--threads 1] [--repeats 10]

Each process runs ``--threads`` CPU threads (1 by default), so two processes use twice the cores of one:
on a machine with at least 2 free cores the ideal ratio is 2.0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

LAYOUTS = (
    ("moe_block", "parallel.data=2"),
    ("moe_block", "parallel.expert=2"),
    ("residual_mlp", "parallel.data=2"),
    ("residual_mlp", "parallel.tensor=2"),
)


def _bench(model: str, layout: str | None, args: argparse.Namespace, report: Path) -> dict[str, object]:
    overrides = [
        "bench",
        f"model={model}",
        f"bench.tokens={args.tokens}",
        f"bench.threads={args.threads}",
        f"bench.repeats={args.repeats}",
        f"bench.report={report}",
        f"hydra.run.dir={report.parent / 'run'}",  # the run directory next to the report, not in the cwd
        "device=cpu",
    ]
    if layout is None:
        command = [sys.executable, "-m", "te_assembly", *overrides]
    else:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
        command = [*launcher, "-m", "te_assembly", *overrides, layout]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env["OMP_NUM_THREADS"] = str(args.threads)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return json.loads(report.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model, layout in LAYOUTS:
            ratios, shares, singles = [], [], []
            for round_ in range(args.rounds):
                order = (None, layout) if round_ % 2 == 0 else (layout, None)
                results = {}
                for which in order:
                    results[which] = _bench(model, which, args, Path(tmp) / "report.json")
                one, two = results[None]["job"], results[layout]["job"]  # type: ignore[index]
                ratios.append(two["tokens_per_s"] / one["tokens_per_s"])  # type: ignore[index]
                shares.append(two["comm_share"])  # type: ignore[index]
                singles.append(one["step_s"])  # type: ignore[index]
            rows.append(
                (
                    model,
                    layout,
                    statistics.median(singles),
                    statistics.median(ratios),
                    statistics.median(shares),
                )
            )
            print(f"done: {model} {layout}", file=sys.stderr, flush=True)
    print(
        f"{args.tokens} tokens per step in all, {args.threads} thread(s) per process, "
        f"median of {args.rounds} round(s)\n"
    )
    print(
        "| model | 2 processes | 1-process step (ms) | job tokens/s, 2 vs 1 | step time in collectives (2) |"
    )
    print("| --- | --- | ---: | ---: | ---: |")
    for model, layout, single, ratio, share in rows:
        print(f"| {model} | `{layout}` | {single * 1e3:.1f} | {ratio:.2f} | {share:.0%} |")


if __name__ == "__main__":
    main()
