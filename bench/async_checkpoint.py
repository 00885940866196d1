"""What a checkpoint every N steps costs the training loop, written synchronously or in the background
(``train.async_checkpoint=true``), against no checkpoint at all.

    python bench/async_checkpoint.py [--hidden 1024] [--ffn 4096] [--steps 60] [--every 10] [--threads 2]

``residual_mlp`` at ``--hidden`` x ``--ffn`` (AdamW: each checkpoint holds the weights and both moments,
about 12 bytes a parameter), trained ``--steps`` steps by the reference engine three ways in one
process, one after the other: checkpoints every ``--every`` steps written synchronously, the same written
in the background, and none but the last. Each way's wall time per step from its first to its last step
(``metrics.jsonl``'s ``elapsed_s``: the steps and every stall between them, the last step's own checkpoint
left out), printed as

    synchronous / none = RATIO
    background / none = RATIO
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _per_step(run: Path) -> float:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "elapsed_s" in r]
    return (steps[-1]["elapsed_s"] - steps[0]["elapsed_s"]) / (len(steps) - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--ffn", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import te_assembly
    from te_assembly.engines.target import Target
    from te_assembly.jobs.train.settings import TrainSettings

    plan = te_assembly.load(
        "residual_mlp", overrides=[f"model.dims.hidden={args.hidden}", f"model.dims.ffn={args.ffn}"]
    ).checked_plan()
    ways = {"synchronous": (args.every, False), "background": (args.every, True), "none": (0, False)}
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="te_assembly-bench-") as where:
        for name, (every, background) in ways.items():
            run = Path(where) / name
            settings = TrainSettings(
                steps=args.steps,
                batch_tokens=64,
                checkpoint_every=every,
                keep_checkpoints=2,
                async_checkpoint=background,
                plot=False,
                loggers=[],
                out_dir=str(run),
            )
            te_assembly.train(plan, Target.of("reference"), settings)
            seconds[name] = _per_step(run)
            print(f"{name}: {1000 * seconds[name]:.1f} ms a step", flush=True)
    params = plan.num_params
    print(
        f"residual_mlp {args.hidden}x{args.ffn}: {params:,} parameters, a checkpoint every {args.every} steps"
    )
    print(f"synchronous / none = {seconds['synchronous'] / seconds['none']:.2f}")
    print(f"background / none = {seconds['background'] / seconds['none']:.2f}")


if __name__ == "__main__":
    main()
