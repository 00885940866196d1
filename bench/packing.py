"""Packed rows (``data.packing=true``) against one conversation a row, on chat data of varied lengths.

    python bench/packing.py [--conversations 256] [--seq-len 256] [--rows 8] [--steps 12] [--threads 2]

A chat set of ``--conversations`` conversations whose lengths vary from a few tokens to nearly
``--seq-len`` (most short, as instruction sets are), rendered with a ChatML template and a word-level
tokenizer made here; ``dense_lm`` trained on it by the reference engine with AdamW, ``--rows`` rows a
step, both ways, interleaved step by step (the order alternating): padded (``data.packing=false``: each
conversation alone in its row, padding after it) and packed (conversations side by side, attention kept
inside each). Each way's real tokens (the conversations' own, padding not counted) per second of
forward + backward + optimizer step, median over ``--steps`` steps; printed as

    packed / padded tokens per second = RATIO
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
WORDS = [f"w{n}" for n in range(200)]


def _folder(where: Path, conversations: int, seq_len: int) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = ["[UNK]", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "user", "assistant", *WORDS]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    (where / "tokenizer.json").write_text(backend.to_str())
    (where / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": CHATML, "eos_token": "<|im_end|>"})
    )
    generator = torch.Generator().manual_seed(0)
    lines = []
    for _ in range(conversations):
        # lengths skewed short: a quarter of the row on average, up to nearly all of it
        answer = int(
            min(seq_len - 16, 4 + torch.empty(1).exponential_(generator=generator).item() * seq_len / 4)
        )
        words = torch.randint(0, len(WORDS), (answer + 4,), generator=generator).tolist()
        user, reply = " ".join(WORDS[w] for w in words[:4]), " ".join(WORDS[w] for w in words[4:])
        lines.append(
            {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]}
        )
    (where / "chat.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from te_assembly import load
    from te_assembly.data.settings import DataSettings, TokenizerSettings
    from te_assembly.engines.target import Target
    from te_assembly.jobs.train.lm_task import LanguageTask
    from te_assembly.jobs.train.loop import Stepper
    from te_assembly.jobs.train.schedule import make_optimizer
    from te_assembly.jobs.train.settings import TrainSettings

    with tempfile.TemporaryDirectory() as tmp:
        folder = _folder(Path(tmp), args.conversations, args.seq_len)
        tokenizer = TokenizerSettings(path=str(folder / "tokenizer.json"), eot="<|im_end|>")
        plan = load("dense_lm").checked_plan()
        target = Target.of("reference", seed=0)
        steppers, tasks = {}, {}
        for way, packing in (("padded", False), ("packed", True)):
            data = DataSettings(
                path=str(folder / "chat.jsonl"),
                format="chat",
                tokenizer=tokenizer,
                packing=packing,
                val_fraction=0.0,
            )
            task = LanguageTask.prepare(
                plan, data, target, tokens=args.rows * args.seq_len, seq_len=args.seq_len
            )
            model = target.build(plan, seed=0).train()
            settings = TrainSettings(lr=1e-3).for_task(True)
            steppers[way] = Stepper(
                model, model, make_optimizer(model.parameters(), settings), task, (), target, None
            )
            tasks[way] = task
        corpus = tasks["packed"].corpus
        mean = sum(len(e.ids) for e in corpus.train) / len(corpus.train)
        print(
            f"{args.conversations} conversations of {mean:.0f} tokens on average in rows of {args.seq_len}: "
            f"{len(corpus.train)} padded rows, {corpus.units} packed"
        )
        times: dict[str, list[float]] = {"padded": [], "packed": []}
        real: dict[str, list[int]] = {"padded": [], "packed": []}
        settings = TrainSettings(lr=1e-3).for_task(True)
        for step in range(1, args.steps + 2):
            order = ("padded", "packed") if step % 2 else ("packed", "padded")
            for way in order:
                batch = tasks[way].batch(step)
                tokens = (
                    int((batch.documents >= 0).sum()) if batch.documents is not None else _real(batch, corpus)
                )
                done = steppers[way].update(settings, step, 1e-3)
                if step > 1:  # the first step of each warms up
                    times[way].append(done.seconds)
                    real[way].append(tokens)
        rate = {
            way: statistics.median(r / t for r, t in zip(real[way], times[way], strict=True)) for way in times
        }
        for way in ("padded", "packed"):
            print(f"{way}: {rate[way]:,.0f} real tokens/s (median of {args.steps} steps)")
        print(f"packed / padded tokens per second = {rate['packed'] / rate['padded']:.2f}")


def _real(batch: object, corpus: object) -> int:
    """A padded batch's conversation tokens: each row up to its padding (the end-of-text id after it)."""
    x = batch.x  # type: ignore[attr-defined]
    pad = corpus.tokenizer.eot_id  # type: ignore[attr-defined]
    reversed_pad = (x.flip(-1) == pad).long().cumprod(-1).sum(-1)
    return int((x.shape[-1] - reversed_pad).sum())


if __name__ == "__main__":
    main()
