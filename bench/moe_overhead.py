"""What the reference engine costs over a hand-written module of the same math.

Builds ``moe_block`` with the reference engine and a plain ``nn.Module`` computing the same block
(same algorithm: sort-based dispatch, one matmul per expert, inverse-permutation combine), copies
the engine's weights into it, checks that outputs and gradients agree, then times forward+backward
of both, interleaved in one process, and prints median times and the ratio engine / hand.

A third contender, ``direct``, calls the engine's own step modules in a hand-wired sequence: the
ratio engine / direct is the engine's routing alone (registers, call checks, named outputs), while
hand / direct shows what op granularity costs (the hand module runs each expert's fc1, SwiGLU and
fc2 back to back; the ops run each stage over all experts' rows before the next).

    python bench/moe_overhead.py [--repeats 30] [--device cpu|cuda] [--dtype float32] [--threads 1]

On CPU it runs single-threaded unless ``--threads`` says otherwise: on a shared machine, OpenMP
threads that wait for a descheduled sibling make multi-threaded timings swing by 10-100x.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from te_assembly.analysis.pipeline import load
from te_assembly.engines import build
from te_assembly.engines.base import AssembledModel
from te_assembly.engines.target import Target

SIZES = ((512, 64), (2048, 256))
"""(tokens, hidden); ffn = 2 * hidden, 8 experts, top 2."""
EXPERTS, TOP_K = 8, 2


class HandMoE(torch.nn.Module):
    """moe_block by hand: pre-RMSNorm, softmax top-k router, SwiGLU experts p * (FC2(h) + b), residual."""

    def __init__(self, hidden: int, ffn: int, experts: int, top_k: int, eps: float, aux_coeff: float) -> None:
        super().__init__()
        self.experts, self.top_k, self.eps, self.aux_coeff = experts, top_k, eps, aux_coeff
        self.norm_weight = torch.nn.Parameter(torch.ones(hidden))
        self.router_weight = torch.nn.Parameter(torch.empty(experts, hidden))
        self.w1 = torch.nn.ParameterList(torch.empty(2 * ffn, hidden) for _ in range(experts))
        self.b1 = torch.nn.ParameterList(torch.empty(2 * ffn) for _ in range(experts))
        self.w2 = torch.nn.ParameterList(torch.empty(hidden, ffn) for _ in range(experts))
        self.b2 = torch.nn.ParameterList(torch.empty(hidden) for _ in range(experts))

    def load_from_engine(self, state: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            self.norm_weight.copy_(state["steps.norm.weight"])
            self.router_weight.copy_(state["steps.router.weight"])
            for e in range(self.experts):
                self.w1[e].copy_(state[f"steps.fc1.weight{e}"])
                self.b1[e].copy_(state[f"steps.fc1.bias{e}"])
                self.w2[e].copy_(state[f"steps.fc2.weight{e}"])
                self.b2[e].copy_(state[f"steps.fc2.bias{e}"])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.norm_weight
        score_dtype = torch.promote_types(x.dtype, torch.float32)
        scores = torch.softmax(F.linear(h.to(score_dtype), self.router_weight.to(score_dtype)), dim=-1)
        top, chosen = scores.topk(self.top_k, dim=-1)
        probs = top / top.sum(dim=-1, keepdim=True)
        flat = chosen.reshape(-1)
        counts = (flat[:, None] == torch.arange(self.experts, device=x.device)).sum(dim=0)
        aux = self.aux_coeff * self.experts * (counts.to(scores.dtype) / flat.numel() * scores.mean(0)).sum()
        order = torch.sort(flat, stable=True).indices
        rows = h.index_select(0, torch.div(order, self.top_k, rounding_mode="floor"))
        row_probs = probs.reshape(-1).index_select(0, order)
        sizes = counts.tolist()
        outs = []
        for e, (x_e, p_e) in enumerate(zip(rows.split(sizes), row_probs.split(sizes), strict=True)):
            gate, up = F.linear(x_e, self.w1[e], self.b1[e]).chunk(2, dim=-1)
            p_e = p_e[:, None].to(x.dtype)
            outs.append(p_e * F.linear(F.silu(gate) * up, self.w2[e], self.b2[e]))  # p * (FC2(h) + b)
        expert_out = torch.cat(outs)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=x.device)
        combined = expert_out.index_select(0, inverse).view(-1, self.top_k, x.shape[-1]).sum(dim=1)
        return combined + x, aux


def make_pair(
    tokens: int, hidden: int, device: torch.device, dtype: torch.dtype
) -> tuple[AssembledModel, HandMoE, torch.Tensor]:
    ffn = 2 * hidden
    overrides = [f"model.dims.hidden={hidden}", f"model.dims.ffn={ffn}", f"model.dims.experts={EXPERTS}"]
    overrides.append("model.dims.align=1")  # the hand-written module pads nothing: compare like with like
    plan = load("moe_block", [*overrides, f"model.dims.top_k={TOP_K}"]).checked_plan()
    torch.manual_seed(0)
    engine = build(plan, Target.of("reference", device=device, dtype=dtype))
    with torch.no_grad():  # non-zero biases, so a bias mistake would show in the check below
        for p in engine.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    router, norm = plan.step("router").args, plan.step("norm").args
    hand = HandMoE(hidden, ffn, EXPERTS, TOP_K, norm["eps"], router["aux_loss_coeff"]).to(device, dtype)
    hand.load_from_engine(engine.state_dict())
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    return engine, hand, x


def step_engine(model: AssembledModel, x: torch.Tensor) -> torch.Tensor:
    y, extras = model(x)
    loss = y.float().square().mean() + extras["aux_loss"].float()
    loss.backward()
    return loss


def direct_forward(steps: torch.nn.ModuleDict, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """moe_block's channels wired by hand between the engine's own reference ops."""
    x, (residual,) = steps["residual"](x)
    x, _ = steps["norm"](x)
    x, (probs, routing_map, aux) = steps["router"](x)
    x, (split_sizes, row_probs, row_map) = steps["dispatch"](x, (probs, routing_map))
    x, _ = steps["fc1"](x, (split_sizes,))
    x, _ = steps["act"](x, (row_probs,))
    x, _ = steps["fc2"](x, (split_sizes, row_probs))
    x, _ = steps["combine"](x, (row_map,))
    x, _ = steps["add_residual"](x, (residual,))
    return x, aux


def step_direct(model: AssembledModel, x: torch.Tensor) -> torch.Tensor:
    y, aux = direct_forward(model.steps, x)
    loss = y.float().square().mean() + aux.float()
    loss.backward()
    return loss


def step_hand(model: HandMoE, x: torch.Tensor) -> torch.Tensor:
    y, aux = model(x)
    loss = y.float().square().mean() + aux.float()
    loss.backward()
    return loss


def check_same(engine: AssembledModel, hand: HandMoE, x: torch.Tensor) -> None:
    tol = {"rtol": 2e-2, "atol": 2e-2} if x.dtype == torch.bfloat16 else {}
    y_engine, extras = engine(x)
    y_hand, aux_hand = hand(x)
    torch.testing.assert_close(y_engine, y_hand, **tol)
    torch.testing.assert_close(extras["aux_loss"], aux_hand, **tol)
    engine.zero_grad(set_to_none=True)
    hand.zero_grad(set_to_none=True)
    step_engine(engine, x)
    step_hand(hand, x)
    assert engine.steps["router"].weight.grad is not None and hand.router_weight.grad is not None
    torch.testing.assert_close(engine.steps["router"].weight.grad, hand.router_weight.grad, **tol)
    torch.testing.assert_close(engine.steps["fc1"].weight0.grad, hand.w1[0].grad, **tol)
    y_direct, aux_direct = direct_forward(engine.steps, x)
    torch.testing.assert_close(y_direct, y_engine, rtol=0, atol=0)
    torch.testing.assert_close(aux_direct, extras["aux_loss"], rtol=0, atol=0)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def bench(tokens: int, hidden: int, repeats: int, device: torch.device, dtype: torch.dtype) -> None:
    engine, hand, x = make_pair(tokens, hidden, device, dtype)
    check_same(engine, hand, x)
    contenders: dict[str, Callable[[], object]] = {
        "engine": lambda: step_engine(engine, x),
        "hand": lambda: step_hand(hand, x),
        "direct": lambda: step_direct(engine, x),
    }
    times: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for i in range(repeats + 3):  # the first 3 rounds warm up allocator and kernels
        # Rotate who goes first, so that none always runs on a warmer (or colder) cache.
        for name in names[i % 3 :] + names[: i % 3]:
            engine.zero_grad(set_to_none=True)
            hand.zero_grad(set_to_none=True)
            seconds = timed(contenders[name], device)
            if i >= 3:
                times[name].append(seconds)
    med = {name: statistics.median(t) for name, t in times.items()}
    shown = "  ".join(f"{name} {t * 1e3:8.3f} ms" for name, t in med.items())
    engine_t = med["engine"]
    ratios = f"engine/hand {engine_t / med['hand']:.3f}  engine/direct {engine_t / med['direct']:.3f}"
    print(f"tokens {tokens:5d}  hidden {hidden:4d}  {shown}  {ratios}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64", "bfloat16"))
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for torch (default 1)")
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    torch.set_num_threads(args.threads)
    print(
        f"moe_block forward+backward, {EXPERTS} experts, top {TOP_K}: reference engine vs hand-written "
        f"module ({device}, {args.dtype}, {torch.get_num_threads()} threads, median of {args.repeats})"
    )
    for tokens, hidden in SIZES:
        bench(tokens, hidden, args.repeats, device, dtype)


if __name__ == "__main__":
    main()
