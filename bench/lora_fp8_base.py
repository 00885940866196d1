"""What a frozen FP8 base costs LoRA fine-tuning in accuracy: the same rank-8 adapters trained on the same
batches from the same weights, once on a bfloat16 base and once on the base under an FP8 recipe (the
adapters stay bfloat16 either way: TE's recipe quantizes the frozen projections' GEMMs, the adapter
branch runs outside them), side by side in one run; the validation losses and their ratio.

    python bench/lora_fp8_base.py [--steps 200] [--recipe fp8_current] [--model dense_lm]

Needs a CUDA GPU and TE (the TE engine with TE's kernels); ``scripts/gpu_check.sh`` runs the gpu tier,
this is the number behind docs/guides/lora.md's FP8 line once a GPU session has run it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import te_assembly
from te_assembly.analysis.recipes import load_recipe
from te_assembly.engines.target import Target
from te_assembly.jobs.train import train
from te_assembly.jobs.train.settings import TrainSettings


def _run(plan: object, recipe: str | None, steps: int, out: str) -> dict[str, float]:
    target = Target.of(
        "te", "te", "cuda", torch.bfloat16, recipe=load_recipe(recipe) if recipe else None, seed=0
    )
    settings = TrainSettings(steps=steps, out_dir=out, plot=False, eval_every=steps, checkpoint_every=0)
    result = train(plan, target, settings)  # type: ignore[arg-type]
    last = result.evaluations[-1][1] if result.evaluations else {}
    return {
        "final_train_loss": sum(result.losses[-10:]) / 10,
        "validation_loss": float(last.get("val_loss", "nan")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--recipe", default="fp8_current")
    parser.add_argument("--model", default="dense_lm")
    parser.add_argument("--rank", type=int, default=8)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/lora_fp8_base.py needs a CUDA GPU and Transformer Engine")
    plan = te_assembly.load(args.model, [f"lora.rank={args.rank}"]).checked_plan()
    with tempfile.TemporaryDirectory() as tmp:
        bf16 = _run(plan, None, args.steps, os.path.join(tmp, "bf16"))
        fp8 = _run(plan, args.recipe, args.steps, os.path.join(tmp, "fp8"))
    ratio = fp8["validation_loss"] / bf16["validation_loss"]
    print(
        json.dumps({"bf16_base": bf16, f"{args.recipe}_base": fp8, "validation_loss_ratio": ratio}, indent=2)
    )


if __name__ == "__main__":
    main()
