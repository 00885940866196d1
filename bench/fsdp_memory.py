"""Peak memory per rank and step time: one process against FSDP2 over two (``parallel.shard=2``), each
with and without activation checkpointing (``train.activation_checkpointing=blocks``), side by side in
one run on the CPU (gloo).

Each configuration trains the same model (``train``'s teacher task, float32, reference engine) in
fresh processes; every rank reports its peak resident memory beyond what it held once torch and
te_assembly were imported (``ru_maxrss``: what the kernel counted, allocator slack included), and the
median step time from ``metrics.jsonl``. The table gives each as a ratio to the single process without
checkpointing.

    python bench/fsdp_memory.py                   # the README's table
    python bench/fsdp_memory.py --layers 8 --hidden 768
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import runpy
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = [
    ("1 process", 1, []),
    ("1 process, checkpointing", 1, ["train.activation_checkpointing=blocks"]),
    ("shard=2", 2, ["parallel.shard=2"]),
    ("shard=2, checkpointing", 2, ["parallel.shard=2", "train.activation_checkpointing=blocks"]),
]


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def worker(report: str, args: list[str]) -> None:
    """Run the CLI in this process; at exit write this rank's peak memory beyond its start."""
    import atexit

    import torch  # noqa: F401  (counted in the baseline, as every run needs it)

    import te_assembly.cli  # noqa: F401

    start = _rss_kib()

    def write() -> None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        rank = os.environ.get("RANK", "0")
        Path(f"{report}.{rank}").write_text(json.dumps({"peak_kib": peak - start}))

    atexit.register(write)
    sys.argv = ["te_assembly", *args]
    runpy.run_module("te_assembly", run_name="__main__")


def measure(
    nproc: int, extra: list[str], model: list[str], steps: int, work: Path, name: str
) -> dict[str, float]:
    out = work / name.replace(" ", "_").replace(",", "").replace("=", "")
    args = [
        "train",
        *model,
        "engine=reference",
        f"train.steps={steps}",
        "train.plot=false",
        "train.checkpoint_every=0",
        f"train.out_dir={out}",
        *extra,
    ]
    report = str(work / f"{out.name}.mem")
    runner = (
        [sys.executable]
        if nproc == 1
        else [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [*runner, __file__, "--worker", report, "--", *args], env=env, capture_output=True, text=True
    )
    if done.returncode:
        raise SystemExit(f"{name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    peaks = [json.loads(Path(f"{report}.{r}").read_text())["peak_kib"] for r in range(nproc)]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    times = [r["step_time_s"] for r in records[1:]]  # step 1 warms up
    return {"peak_mib": max(peaks) / 1024, "step_s": statistics.median(times)}


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[4:])
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--steps", type=int, default=6)
    opts = parser.parse_args()
    model = [
        "model=dense_transformer",
        f"model.dims.layers={opts.layers}",
        f"model.dims.hidden={opts.hidden}",
        f"model.dims.ffn={4 * opts.hidden}",
        "train.batch_tokens=256",
        "train.seq_len=64",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        results = {name: measure(n, extra, model, opts.steps, Path(tmp), name) for name, n, extra in CASES}
    base = results[CASES[0][0]]
    print(f"dense_transformer layers={opts.layers} hidden={opts.hidden}, float32, CPU, {opts.steps} steps")
    print(
        f"{'configuration':<28} {'peak MiB/rank':>14} {'vs 1 process':>13} {'step ms':>9}"
        f" {'vs 1 process':>12}"
    )
    for name, r in results.items():
        print(
            f"{name:<28} {r['peak_mib']:>14.1f} {r['peak_mib'] / base['peak_mib']:>13.2f} "
            f"{r['step_s'] * 1e3:>9.1f} {r['step_s'] / base['step_s']:>12.2f}"
        )


if __name__ == "__main__":
    main()
