"""What the TE engine costs over the same TE objects wired by hand: build time and forward+backward.

    python bench/te_overhead.py [--sizes 1000 10000] [--chain 32] [--repeats 2000] [--threads 1]

The models are chains of TE's CPU-capable ops (MakeExtraOutput, Bias, ConstantScale, Identity,
AddExtraInput) in blocks of five: a tap on a hidden channel, a bias, a scale, an identity, the tap
added back. The forward chain also has one public output and one public input.

1. Build: ``te_assembly.build(plan, "te")`` against TE's own work for the same ops (construct
   every op, make every channel setter call, construct the ``OperationFuser``), best of 3, at each
   size. The validated plan is made beforehand and timed on its own (``load``); the ratio column is
   build / TE's own, and per-op microseconds show whether growth is linear. ``build`` pauses Python's
   cyclic garbage collector while it constructs (its full passes over thousands of new modules are
   what grows quadratically, in TE's own construction as much as in ours); TE's own is timed both that
   way (the ratio) and as it comes.
2. Forward+backward of the ``--chain``-op model on a small batch: ``model(x, **inputs)`` (named call,
   the API users call) and ``model.forward_positional`` against ``OperationFuser(ops)(x, *inputs)``
   built by hand, same loss, interleaved in one process (rotating order), median of ``--repeats``.

Run single-threaded (the default) on CPU: OpenMP threads waiting for a descheduled sibling make
timings of small tensors swing far more than the overheads measured here.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from te_assembly.analysis.pipeline import load
from te_assembly.engines import build
from te_assembly.engines.target import Target

WIDTH = 64
HID = {"public": False}  # a channel the caller does not see


def chain(num_ops: int, public: bool = True) -> dict[str, Any]:
    """A valid model of exactly ``num_ops`` CPU-capable TE ops (see the module docstring)."""
    ops: list[dict[str, Any]] = []
    tail = 2 if public else 0
    b = 0
    while len(ops) + 5 <= num_ops - tail:
        ops += [
            {
                "name": f"tap{b}",
                "op": "MakeExtraOutput",
                "extra_outputs": {"out": {"channel": f"c{b}", **HID}},
            },
            {"name": f"bias{b}", "op": "Bias", "args": {"size": WIDTH}},
            {"name": f"scale{b}", "op": "ConstantScale", "args": {"scale": 0.5 + 0.01 * (b % 7)}},
            {"name": f"id{b}", "op": "Identity"},
            {"name": f"add{b}", "op": "AddExtraInput", "extra_inputs": {"addend": f"c{b}"}},
        ]
        b += 1
    if public:
        ops.append({"name": "probe", "op": "MakeExtraOutput"})  # public output probe_out
        ops.append({"name": "inject", "op": "AddExtraInput"})  # public input inject_addend
    ops += [{"name": f"pad{i}", "op": "Identity"} for i in range(num_ops - len(ops))]
    return {"name": f"chain{num_ops}", "in_features": WIDTH, "ops": ops}


def hand_built(model: dict[str, Any], dtype: torch.dtype) -> Any:
    """TE's own work for ``model``: construct each op, bind its channels, construct the fuser."""
    import transformer_engine.pytorch as te
    from transformer_engine.pytorch.ops.fuser import OperationFuser

    ops = []
    for step in model["ops"]:
        kind = step["op"]
        if kind == "Bias":
            op = te.ops.Bias(step["args"]["size"], device="cpu", dtype=dtype)
        elif kind == "ConstantScale":
            op = te.ops.ConstantScale(step["args"]["scale"])
        else:
            op = getattr(te.ops, kind)()
        for slot, channel in enumerate((step.get("extra_inputs") or {}).values()):
            op.set_extra_input_channel(slot, channel)
        for slot, out in enumerate((step.get("extra_outputs") or {}).values()):
            op.set_extra_output_channel(slot, out["channel"], output_to_caller=out["public"])
        ops.append(op)
    return OperationFuser(ops)


def best_of(fn: Callable[[], object], repeats: int = 3, pause_gc: bool = False) -> float:
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        if pause_gc:
            gc.disable()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
        gc.enable()
    return best


def bench_build(sizes: list[int], dtype: torch.dtype) -> None:
    print(
        "build(plan, 'te') vs TE's own construct + bind + OperationFuser (best of 3). build pauses\n"
        "Python's cyclic GC while it constructs; 'TE own' is timed the same way, 'TE own, GC on' as is."
    )
    print(
        f"{'ops':>8} {'analyze s':>10} {'build s':>9} {'TE own s':>9} {'ratio':>6} {'build µs/op':>12} "
        f"{'TE own µs/op':>13} {'TE own, GC on s':>16}"
    )
    for n in sizes:
        model = chain(n, public=False)
        analysis = load(model)
        plan = analysis.plan
        assert plan is not None, [d.format() for d in analysis.diagnostics]
        analyze_s = best_of(lambda m=model: load(m), 1 if n > 10_000 else 3)  # type: ignore[misc]
        build_s = best_of(lambda p=plan: build(p, Target.of("te", dtype=dtype)))  # type: ignore[misc]
        own_s = best_of(lambda m=model: hand_built(m, dtype), pause_gc=True)  # type: ignore[misc]
        own_gc_s = best_of(lambda m=model: hand_built(m, dtype))  # type: ignore[misc]
        ratio, per_op, own_per_op = build_s / own_s, build_s / n * 1e6, own_s / n * 1e6
        print(
            f"{n:>8,} {analyze_s:>10.3f} {build_s:>9.3f} {own_s:>9.3f} {ratio:>6.2f} {per_op:>12.1f} "
            f"{own_per_op:>13.1f} {own_gc_s:>16.3f}"
        )


def _loss(y: torch.Tensor, outs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    loss = y.square().mean()
    for t in outs:
        loss = loss + t.square().mean()
    return loss


def bench_step(num_ops: int, tokens: int, repeats: int, dtype: torch.dtype, public: bool) -> None:
    model = chain(num_ops, public)
    analysis = load(model)
    plan = analysis.plan
    assert plan is not None, [d.format() for d in analysis.diagnostics]
    engine = build(plan, Target.of("te", dtype=dtype))
    fuser = hand_built(model, dtype)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, WIDTH, generator=gen, dtype=dtype).requires_grad_(True)
    addend = torch.randn(tokens, WIDTH, generator=gen, dtype=dtype).requires_grad_(True)
    named_inputs = {"inject_addend": addend} if public else {}
    inputs = tuple(named_inputs.values())

    def _outputs(result: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return result if isinstance(result, tuple) else (result,)

    def named() -> None:
        y, extras = engine(x, **named_inputs)
        _loss(y, tuple(extras.values())).backward()

    def positional() -> None:
        y, *outs = _outputs(engine.forward_positional(x, *inputs))
        _loss(y, tuple(outs)).backward()

    def by_hand() -> None:
        y, *outs = _outputs(fuser(x, *inputs))
        _loss(y, tuple(outs)).backward()

    # Same math: the engine's outputs equal the hand-built fuser's.
    y_e, extras = engine(x, **named_inputs)
    y_h, *out_h = _outputs(fuser(x, *inputs))
    torch.testing.assert_close(y_e, y_h, rtol=0, atol=0)
    torch.testing.assert_close(list(extras.values()), out_h, rtol=0, atol=0)

    contenders = {"engine(x, **inputs)": named, "forward_positional": positional, "OperationFuser": by_hand}
    names = list(contenders)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for i in range(repeats + 50):  # 50 warm-up rounds
        for name in names[i % 3 :] + names[: i % 3]:
            x.grad = addend.grad = None
            start = time.perf_counter()
            contenders[name]()
            if i >= 50:
                samples[name].append(time.perf_counter() - start)
    med = {name: statistics.median(s) for name, s in samples.items()}
    base = med["OperationFuser"]
    kind = "one public input and output" if public else "hidden channels only"
    print(
        f"\nforward+backward, {num_ops}-op chain ({kind}), {tokens} x {WIDTH} "
        f"{str(dtype).removeprefix('torch.')}, median of {repeats}, interleaved"
    )
    for name, t in med.items():
        print(f"  {name:<22} {t * 1e6:9.1f} µs  ratio to hand-built fuser {t / base:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000])
    parser.add_argument("--chain", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-build", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import transformer_engine

    print(
        f"Python {platform.python_version()}, torch {torch.__version__}, "
        f"TE {transformer_engine.__version__}, {torch.get_num_threads()} thread(s), "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    dtype = torch.float32
    if not args.skip_build:
        bench_build(args.sizes, dtype)
    for public in (False, True):
        bench_step(args.chain, args.tokens, args.repeats, dtype, public)


if __name__ == "__main__":
    main()
