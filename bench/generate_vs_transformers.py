"""Greedy generation with a key/value cache: te_assembly against transformers' ``generate``.

    python bench/generate_vs_transformers.py [--layers 30] [--new 128] [--prompt 32] [--rounds 3]
                                             [--threads 2]

One random Llama checkpoint made by ``transformers`` at a 135M-class size (SmolLM2-135M's shape: 30
layers, 576 wide, 9 query / 3 key-value heads, a 1536-wide SwiGLU, a 49,152-token vocabulary, tied
embeddings), float32 on CPU, loaded by transformers (``attn_implementation="sdpa"``, its own dynamic
KV cache) and by te_assembly (``from_hf``, the reference engine). Each round both continue the same
random prompt by ``--new`` tokens greedily (no stop token), the order alternating; the tokens must be
equal, and the time is the whole call (prompt and every new token). Reported: the median over rounds
of each, and the ratio. Goal: te_assembly at least as fast as transformers (ratio >= 1.0).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import smollm_shape

from te_assembly.jobs.generate.decode import decode
from te_assembly.jobs.generate.job import next_token
from te_assembly.jobs.generate.settings import GenerateSettings


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    theirs, ours, config = smollm_shape.both(args.layers)
    theirs.eval()
    print(
        f"random Llama, {args.layers} layers, 576 wide, 9/3 heads, vocab 49,152, float32; a "
        f"{args.prompt}-token prompt, {args.new} new tokens, greedy; torch {torch.__version__}, transformers "
        f"{transformers.__version__}, {torch.get_num_threads()} threads, {platform.python_version()}"
    )
    settings = GenerateSettings(temperature=0, max_new_tokens=args.new, context=args.prompt + args.new)

    def run_ours(prompt: list[int]) -> list[int]:
        return decode(ours, [prompt], settings, torch.Generator(), next_token, frozenset()).ids[0]

    def run_theirs(prompt: list[int]) -> list[int]:
        with torch.no_grad():
            out = theirs.generate(
                input_ids=torch.tensor([prompt]),
                max_new_tokens=args.new,
                min_new_tokens=args.new,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
        return out[0, len(prompt) :].tolist()

    runs = {"te_assembly": run_ours, "transformers": run_theirs}
    times: dict[str, list[float]] = {name: [] for name in runs}
    generator = torch.Generator().manual_seed(1)
    run_ours([1, 2, 3])  # warm-up: first-call costs are not generation's
    run_theirs([1, 2, 3])
    for i in range(args.rounds):
        prompt = torch.randint(0, config.vocab_size, (args.prompt,), generator=generator).tolist()
        tokens = {}
        for name in list(runs) if i % 2 == 0 else list(reversed(runs)):
            began = time.perf_counter()
            tokens[name] = runs[name](prompt)
            times[name].append(time.perf_counter() - began)
        assert tokens["te_assembly"] == tokens["transformers"], f"round {i}: the greedy tokens differ"
    rate = {name: args.new / statistics.median(t) for name, t in times.items()}
    ratio = rate["te_assembly"] / rate["transformers"]
    print("\n| greedy generation, KV cache | new tokens/s (median, prompt included) |")
    print("| --- | ---: |")
    for name, value in rate.items():
        print(f"| {name} | {value:,.1f} |")
    met = "met" if ratio >= 1.0 else "NOT met"
    print(f"te_assembly / transformers: {ratio:.2f} (goal at least 1.0: {met}); the same tokens every round")


if __name__ == "__main__":
    main()
