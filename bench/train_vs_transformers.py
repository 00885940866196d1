"""A training step of an imported checkpoint: te_assembly against transformers' own ``LlamaForCausalLM``.

    python bench/train_vs_transformers.py [--layers 30] [--steps 12] [--batch 4] [--seq 256] [--threads 2]

One random Llama checkpoint made by ``transformers`` (SmolLM2-135M's shape by default: 30 layers, 576
wide, 9 query / 3 key-value heads, a 1536-wide SwiGLU, a 49,152-token vocabulary, tied embeddings),
loaded twice from the same directory: by transformers (``attn_implementation="sdpa"``, its default) and
by te_assembly (``te_assembly.from_hf``, the reference engine on CPU). Both train from the same weights
on the same random token batches: forward, next-token cross-entropy over the same positions, backward,
AdamW; the two steps interleaved in one loop (the order alternating, two warm-up rounds), median of
``--steps``. Before timing, the first step's losses are compared (they must agree to float32 rounding:
the two models are the same function). Goal: te_assembly at least 1.0x transformers' tokens/s.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import smollm_shape

from te_assembly.jobs import objective


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    theirs, ours, config = smollm_shape.both(args.layers)
    theirs.train(), ours.train()
    params = sum(p.numel() for p in ours.parameters())
    print(
        f"random Llama, {args.layers} layers, 576 wide, 9/3 heads, vocab 49,152 ({params:,} parameters), "
        f"float32, batches of {args.batch} x {args.seq} tokens; torch {torch.__version__}, transformers "
        f"{transformers.__version__}, {torch.get_num_threads()} threads, {platform.python_version()}"
    )

    def ours_loss(ids: torch.Tensor) -> torch.Tensor:
        y, extras = ours(ids[:, :-1])
        terms = objective.next_token_terms(y, ids[:, 1:], extras, ours.loss_output_names)
        return objective.total(terms)

    def theirs_loss(ids: torch.Tensor) -> torch.Tensor:
        logits = theirs(input_ids=ids[:, :-1]).logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))

    losses = {"te_assembly": ours_loss, "transformers": theirs_loss}
    optimizers = {
        "te_assembly": torch.optim.AdamW(ours.parameters(), lr=1e-4),
        "transformers": torch.optim.AdamW(theirs.parameters(), lr=1e-4),
    }
    generator = torch.Generator().manual_seed(1)
    first = torch.randint(0, config.vocab_size, (args.batch, args.seq + 1), generator=generator)
    with torch.no_grad():
        a, b = ours_loss(first).item(), theirs_loss(first).item()
    print(f"first loss: te_assembly {a:.6f}, transformers {b:.6f} (difference {abs(a - b):.1e})")
    assert abs(a - b) <= 1e-4 * abs(b), "the two models disagree: not the same function"

    times: dict[str, list[float]] = {name: [] for name in losses}
    for i in range(args.steps + 2):
        ids = torch.randint(0, config.vocab_size, (args.batch, args.seq + 1), generator=generator)
        order = list(losses) if i % 2 == 0 else list(reversed(losses))
        for name in order:
            optimizers[name].zero_grad(set_to_none=True)
            began = time.perf_counter()
            losses[name](ids).backward()
            optimizers[name].step()
            if i >= 2:  # two warm-up rounds
                times[name].append(time.perf_counter() - began)
    tokens = args.batch * args.seq
    rate = {name: tokens / statistics.median(t) for name, t in times.items()}
    ratio = rate["te_assembly"] / rate["transformers"]
    print("\n| train step (forward, cross-entropy, backward, AdamW) | tokens/s (median) |")
    print("| --- | ---: |")
    for name, value in rate.items():
        print(f"| {name} | {value:,.0f} |")
    met = "met" if ratio >= 1.0 else "NOT met"
    print(f"te_assembly / transformers tokens/s: {ratio:.2f} (goal at least 1.0: {met})")


if __name__ == "__main__":
    main()
