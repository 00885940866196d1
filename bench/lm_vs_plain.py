"""dense_lm trained by te_assembly against the same architecture written by hand in plain PyTorch.

    python bench/lm_vs_plain.py [--steps 200] [--threads 2] [--timing-steps 20]

The plain model below does not use te_assembly: an ``nn.Embedding``, per layer RMSNorm, a packed QKV
``nn.Linear``, grouped-query attention with rotary embeddings through
``scaled_dot_product_attention``, the output projection and residual, RMSNorm, a SwiGLU MLP and its
residual; a final RMSNorm and a head tied to the embedding. Both start from the same weights (the plain
model copies te_assembly's initial ones), see the same batches (the default corpus, byte-level, the
batches a pure function of (seed, step)), and step with AdamW and the same warm-up + cosine schedule.

1. Quality: te_assembly's ``train`` job (the code ``python -m te_assembly train model=dense_lm`` runs)
   for ``--steps`` steps against a plain training loop of the same steps; the validation loss of each at
   the end on the same held-out windows. Goal: te_assembly's within 2% of the plain model's. Each run's
   median step time is shown too (the runs one after the other, so the machine may differ between them).
2. Speed: tokens/s of a training step (forward, cross-entropy, backward, AdamW), te_assembly's built
   model and objective against the plain ones, interleaved step by step in one loop (both on the same
   batch each step, the order alternating), median of ``--timing-steps``. Goal: at least 1.0x.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import te_assembly
from te_assembly.data.cache import prepare
from te_assembly.data.corpus import Corpus
from te_assembly.data.settings import DataSettings
from te_assembly.engines.target import Target
from te_assembly.jobs import objective
from te_assembly.jobs.train.job import train
from te_assembly.jobs.train.settings import TrainSettings

# --- the plain model: no te_assembly below this line until PlainLM ends ----------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    a, b = t.chunk(2, dim=-1)
    return t * cos + torch.cat((-b, a), dim=-1) * sin


class Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.attn_norm = nn.Parameter(torch.ones(hidden))
        self.qkv = nn.Linear(hidden, (heads + 2 * kv_heads) * head_dim, bias=False)
        self.proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.mlp_norm = nn.Parameter(torch.ones(hidden))
        self.fc1 = nn.Linear(hidden, 2 * ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h, g, d = self.heads, self.kv_heads, self.head_dim
        q, k, v = self.qkv(rms_norm(x, self.attn_norm)).split((h * d, g * d, g * d), dim=-1)
        q = rotate(q.view(b, s, h, d).transpose(1, 2), cos, sin)
        k = rotate(k.view(b, s, g, d).transpose(1, 2), cos, sin).repeat_interleave(h // g, dim=1)
        v = v.view(b, s, g, d).transpose(1, 2).repeat_interleave(h // g, dim=1)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, h * d))
        gate, up = self.fc1(rms_norm(x, self.mlp_norm)).chunk(2, dim=-1)
        return x + self.fc2(F.silu(gate) * up)


class PlainLM(nn.Module):
    def __init__(
        self, vocab: int, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int
    ):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(Layer(hidden, heads, kv_heads, head_dim, ffn) for _ in range(layers))
        self.norm = nn.Parameter(torch.ones(hidden))
        self.head_dim = head_dim

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        seq = ids.shape[1]
        inv = 1.0 / (10000.0 ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
        cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return rms_norm(x, self.norm) @ self.embed.weight.T  # the head, tied to the embedding


def plain_of(dims: dict[str, int]) -> PlainLM:
    keys = ("vocab", "layers", "hidden", "heads", "kv_heads", "head_dim", "ffn")
    return PlainLM(*(dims[k] for k in keys))


def lr_at(step: int, lr: float, warmup: int, steps: int, floor_ratio: float) -> float:
    if warmup and step <= warmup:
        return lr * step / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    floor = lr * floor_ratio
    return floor + (lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


# --- te_assembly against it -----------------------------------------------------------------------


def copy_into_plain(state: dict[str, torch.Tensor], plain: PlainLM, layers: int) -> None:
    """te_assembly's parameter names -> the plain model's (the same tensors, written by hand)."""
    with torch.no_grad():
        plain.embed.weight.copy_(state["steps.embed.weight"])
        plain.norm.copy_(state["steps.final_norm.weight"])
        for i, layer in enumerate(plain.layers):
            p = f"steps.layers.{i}."
            layer.attn_norm.copy_(state[p + "attn_norm.weight"])
            layer.qkv.weight.copy_(state[p + "qkv.basic_ops.0.weight"])
            layer.proj.weight.copy_(state[p + "proj.basic_ops.0.weight"])
            layer.mlp_norm.copy_(state[p + "mlp_norm.weight"])
            layer.fc1.weight.copy_(state[p + "fc1.basic_ops.0.weight"])
            layer.fc1.bias.copy_(state[p + "fc1.basic_ops.1.bias"])
            layer.fc2.weight.copy_(state[p + "fc2.basic_ops.0.weight"])
            layer.fc2.bias.copy_(state[p + "fc2.basic_ops.1.bias"])
    assert len(plain.layers) == layers


def validation_loss(forward, corpus: Corpus, sequences: int, batches: int) -> float:  # type: ignore[no-untyped-def]
    total, count = 0.0, 0
    with torch.no_grad():
        for x, labels in corpus.eval_batches(batches, sequences):
            logits = forward(x)
            total += F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum"
            ).item()
            count += labels.numel()
    return total / count


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--timing-steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    plan = te_assembly.load("dense_lm").checked_plan()
    dims = {k: int(v) for k, v in plan.dims.items()}
    settings = TrainSettings(steps=args.steps, eval_every=0, plot=False, loggers=[]).for_task(True)
    seq_len, sequences = settings.positions, settings.tokens // settings.positions
    corpus = Corpus(prepare(DataSettings()), seq_len)
    print(
        f"dense_lm ({plan.num_params:,} parameters), {args.steps} steps of {sequences} x {seq_len} tokens, "
        f"byte-level, the default corpus; torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.python_version()}"
    )

    # 1. quality: te_assembly's train job against a plain loop from the same initial weights
    torch.manual_seed(args.seed)
    initial = te_assembly.build(plan, "reference").state_dict()  # what the job builds with this seed
    with tempfile.TemporaryDirectory() as tmp:
        run_settings = dataclasses.replace(settings, out_dir=str(Path(tmp) / "run"))
        job = train(plan, Target.of("reference", seed=args.seed), run_settings)
        records = (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()
        job_step = statistics.median(json.loads(line)["step_time_s"] for line in records)
    assert job.model is not None
    job.model.eval()
    te_loss = validation_loss(lambda x: job.model(x).y, corpus, sequences, settings.eval_batches)

    plain = plain_of(dims)
    copy_into_plain(initial, plain, dims["layers"])
    opt = torch.optim.AdamW(plain.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    plain_times = []
    for step in range(1, args.steps + 1):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, settings.lr, settings.warmup_steps, args.steps, settings.min_lr_ratio)
        x, labels = corpus.batch(args.seed, step, sequences)
        began = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = plain(x)
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)).backward()
        opt.step()
        plain_times.append(time.perf_counter() - began)
    plain_step = statistics.median(plain_times)
    plain.eval()
    plain_loss = validation_loss(plain, corpus, sequences, settings.eval_batches)
    tokens = sequences * seq_len
    print("\n| model | validation loss | tokens/s (median step; the runs one after the other) |")
    print("| --- | ---: | ---: |")
    print(f"| te_assembly `train` | {te_loss:.4f} | {tokens / job_step:,.0f} |")
    print(f"| plain PyTorch | {plain_loss:.4f} | {tokens / plain_step:,.0f} |")
    gap = te_loss / plain_loss - 1
    met = "met" if abs(gap) <= 0.02 else "NOT met"
    print(f"te_assembly / plain validation loss: {1 + gap:.4f} ({gap:+.2%}; goal within 2%: {met})")

    # 2. speed: the two step functions interleaved on the same batches
    torch.manual_seed(args.seed)
    model = te_assembly.build(plan, "reference").train()
    plain = plain_of(dims)
    copy_into_plain(model.state_dict(), plain, dims["layers"])
    opts = {
        "te_assembly": torch.optim.AdamW(model.parameters(), lr=1e-4),
        "plain": torch.optim.AdamW(plain.parameters(), lr=1e-4),
    }

    def te_step(x: torch.Tensor, labels: torch.Tensor) -> None:
        y, extras = model(x)
        objective.total(objective.next_token_terms(y, labels, extras, model.loss_output_names)).backward()

    def plain_step(x: torch.Tensor, labels: torch.Tensor) -> None:
        logits = plain(x)
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)).backward()

    steps = {"te_assembly": te_step, "plain": plain_step}
    times: dict[str, list[float]] = {name: [] for name in steps}
    for i in range(args.timing_steps + 2):
        x, labels = corpus.batch(args.seed + 1, i + 1, sequences)
        order = list(steps) if i % 2 == 0 else list(reversed(steps))
        for name in order:
            opts[name].zero_grad(set_to_none=True)
            began = time.perf_counter()
            steps[name](x, labels)
            opts[name].step()
            if i >= 2:  # two warm-up rounds
                times[name].append(time.perf_counter() - began)
    rate = {name: tokens / statistics.median(t) for name, t in times.items()}
    ratio = rate["te_assembly"] / rate["plain"]
    print("\n| step (forward, cross-entropy, backward, AdamW) | tokens/s (median) |")
    print("| --- | ---: |")
    for name, value in rate.items():
        print(f"| {name} | {value:,.0f} |")
    met = "met" if ratio >= 1.0 else "NOT met"
    print(f"te_assembly / plain tokens/s: {ratio:.2f} (goal at least 1.0: {met})")


if __name__ == "__main__":
    main()
