"""Peak memory and speed of a fine-tuning step with the loss in chunks: te_assembly against transformers.

    python bench/chunked_loss.py [--layers 30] [--batch 8] [--seq 256] [--chunk 1024 512] [--steps 3]
                                 [--threads 2] [--checkpointing none blocks]

One random Llama checkpoint at SmolLM2-135M's shape (``smollm_shape.py``: a 49,152-token vocabulary,
tied embeddings), loaded by transformers (SDPA) and by te_assembly (the reference engine on CPU), float32.
Each side runs an SFT step on the same rows: forward, next-token cross-entropy over the answers (the
first half of every row is the prompt, its labels ignored), backward. te_assembly runs it with the
logits whole, and with the head and loss in chunks of each ``--chunk`` tokens (``train.loss_chunk_tokens``,
``engines/head_chunks.py``). Per ``--checkpointing`` setting (none: every activation kept; blocks: each
decoder layer recomputed in backward, transformers' ``gradient_checkpointing_enable()``), the sides are
measured in one process:

- peak: the most memory glibc had handed out at any op of the step (``mallinfo2``: heap and mmapped
  blocks) above what was in use before it, the weights' gradient buffers already allocated (what a
  trainer holds between steps, as the weights and the optimizer's state, is not the step's; the
  gradients' size is printed beside);
- speed: the median of ``--steps`` timed steps, the sides interleaved (the order alternating), after
  one warm-up each.

Before timing, the losses of the first rows must agree to float32 rounding. Goal (issue #43):
chunked peak at most 0.5x transformers', at least its speed.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable

import torch
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import smollm_shape

from te_assembly.engines.head_chunks import reduced_logits
from te_assembly.jobs import objective
from te_assembly.testing.host_memory import PeakInUse


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--chunk", type=int, nargs="+", default=[1024, 512])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--checkpointing", nargs="+", default=["none", "blocks"], choices=("none", "blocks"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    theirs, ours, config = smollm_shape.both(args.layers)
    theirs.train(), ours.train()
    print(
        f"random Llama, {args.layers} layers, 576 wide, vocab 49,152, float32, an SFT step on "
        f"{args.batch} x {args.seq} tokens (the first half of each row a prompt), te_assembly's chunks of "
        f"{' and '.join(map(str, args.chunk))} tokens; torch {torch.__version__}, transformers "
        f"{transformers.__version__}, {torch.get_num_threads()} threads, {platform.python_version()}"
    )
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq + 1), generator=generator)
    x, labels = ids[:, :-1], ids[:, 1:].clone()
    labels[:, : args.seq // 2] = objective.IGNORE_INDEX

    def theirs_loss() -> torch.Tensor:
        logits = theirs(input_ids=x).logits
        flat = logits.reshape(-1, logits.shape[-1]).float()
        return F.cross_entropy(flat, labels.reshape(-1), ignore_index=objective.IGNORE_INDEX)

    def ours_whole() -> torch.Tensor:
        y, extras = ours(x)
        return objective.total(objective.next_token_terms(y, labels, extras, ()))

    def ours_chunked(tokens: int) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            with reduced_logits(ours, objective.next_token_reduction(labels, tokens)):
                y, extras = ours(x)
            return objective.total(objective.next_token_terms(y, labels, extras, (), reduced=True))

        return run

    sides: dict[str, Callable[[], torch.Tensor]] = {
        "transformers": theirs_loss,
        "te_assembly, logits whole": ours_whole,
        **{f"te_assembly, chunks of {tokens}": ours_chunked(tokens) for tokens in args.chunk},
    }
    with torch.no_grad():
        first = {name: run().item() for name, run in sides.items()}
    spread = max(first.values()) - min(first.values())
    print(f"first loss: {first} (spread {spread:.1e})")
    assert spread <= 1e-4 * abs(first["transformers"]), "the sides disagree: not the same function"
    tokens = args.batch * args.seq
    grads = sum(p.numel() * p.element_size() for p in ours.parameters() if p.requires_grad)
    print(f"gradient buffers (allocated before each measured step, not counted): {grads / 2**20:,.0f} MiB")
    for checkpointing in args.checkpointing:
        with warnings.catch_warnings():  # transformers 5 renames these, the old names still work
            warnings.simplefilter("ignore", FutureWarning)
            if checkpointing == "blocks":
                theirs.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            else:
                theirs.gradient_checkpointing_disable()
        ours.configure(activation_checkpointing=checkpointing)
        peaks, times = _measure(sides, (theirs, ours), args.steps)
        print(f"\n| activation checkpointing: {checkpointing} | peak MiB | tokens/s (median) |")
        print("| --- | ---: | ---: |")
        for name in sides:
            rate = tokens / statistics.median(times[name])
            print(f"| {name} | {peaks[name] / 2**20:,.0f} | {rate:,.0f} |")
        base = "transformers"
        for tokens in args.chunk:
            name = f"te_assembly, chunks of {tokens}"
            memory = peaks[name] / peaks[base]
            speed = statistics.median(times[base]) / statistics.median(times[name])
            print(
                f"chunks of {tokens}: peak / transformers' = {memory:.2f} (goal at most 0.5: "
                f"{_met(memory <= 0.5)}), tokens/s / transformers' = {speed:.2f} (goal at least 1.0: "
                f"{_met(speed >= 1.0)})"
            )


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _measure(
    sides: dict[str, Callable[[], torch.Tensor]], models: tuple[torch.nn.Module, ...], steps: int
) -> tuple[dict[str, int], dict[str, list[float]]]:
    def step(run: Callable[[], torch.Tensor]) -> None:
        for model in models:
            model.zero_grad(set_to_none=True)
        gc.collect()
        run().backward()

    peaks: dict[str, int] = {}
    for name, run in sides.items():
        step(run)  # warm-up: one-time allocations (thread pools, tables) are not the step's
        for model in models:
            model.zero_grad(set_to_none=False)  # the gradient buffers stay, as between a trainer's steps
        gc.collect()
        with PeakInUse() as measured:
            run().backward()
        peaks[name] = measured.peak
        for model in models:
            model.zero_grad(set_to_none=True)
    times: dict[str, list[float]] = {name: [] for name in sides}
    for i in range(steps):
        order = list(sides) if i % 2 == 0 else list(reversed(sides))
        for name in order:
            for model in models:
                model.zero_grad(set_to_none=True)
            gc.collect()
            began = time.perf_counter()
            sides[name]().backward()
            times[name].append(time.perf_counter() - began)
    return peaks, times


if __name__ == "__main__":
    main()
