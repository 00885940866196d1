"""Seeded random channel graphs (model mappings) of TE's CPU-capable ops and our MoE ops.

Channel names come from one pool per slot dtype and shape, and every op keeps the width and uses the same MoE
arguments, so the only rules a graph can break are the ones TE itself enforces (dangling input,
producer at or after the consumer, several producers) plus fuser crossings when modules split it.
"""

from __future__ import annotations

import random
from typing import Any

from te_assembly.catalog import OPS

WIDTH = 8
TE_CPU_OPS = ("MakeExtraOutput", "AddExtraInput", "Bias", "ConstantScale", "Identity")
MOE_OPS = ("TopKRouter", "Dispatch", "Combine")
FLOAT_POOL = ("f0", "f1", "f2", "f3")
INT_POOL = ("i0", "i1", "i2")
ROUTER_POOL = ("r0", "r1", "r2")
"""Names only router outputs use in runnable graphs: hidden-and-unused or public, never consumed."""


def _args(op: str, rng: random.Random) -> dict[str, Any]:
    return {
        "Bias": {"size": WIDTH},
        "ConstantScale": {"scale": rng.choice([0.5, 2.0, -1.5])},
        "TopKRouter": {"in_features": WIDTH, "num_experts": 4, "top_k": 2},
        "Dispatch": {"num_experts": 4, "top_k": 2},
        "Combine": {"top_k": 2},
    }.get(op, {})


def _pool(dtype: str, shape: str) -> tuple[str, ...]:
    # Shapes TE does not check at construction (a [tokens, top_k] tensor into a per-row slot) keep pools
    # apart, like dtypes: the main-path pool keeps the plain names.
    names = FLOAT_POOL if dtype == "float" else INT_POOL
    return names if shape == "main" else tuple(f"{n}_{shape}" for n in names)


def random_model(
    rng: random.Random,
    *,
    ops: tuple[str, ...],
    modules: tuple[str, ...] = (),
    steps: tuple[int, int] = (1, 7),
    bind: float = 0.7,
    runnable: bool = False,
) -> dict[str, Any]:
    """A model mapping. ``runnable``: router outputs go to ``ROUTER_POOL`` (never consumed), so any
    valid graph also runs forward and backward on plain ``[tokens, WIDTH]`` data."""
    out: list[dict[str, Any]] = []
    for i in range(rng.randint(*steps)):
        if modules and rng.random() < 0.2:
            module = rng.choice(modules)
            args = {"in_features": WIDTH, "out_features": WIDTH} if module == "Linear" else {}
            out.append({"name": f"s{i}", "module": module, "args": args})
            continue
        op = rng.choice(ops)
        spec, args = OPS[op], _args(op, rng)
        step: dict[str, Any] = {"name": f"s{i}", "op": op, "args": args}
        inputs = {
            slot.name: (rng.choice(_pool(slot.dtype, slot.shape)) if rng.random() < bind else None)
            for slot in spec.input_slots(args)
        }
        outputs = {}
        for slot in spec.output_slots(args):
            if rng.random() < bind:
                pool = ROUTER_POOL if runnable and op == "TopKRouter" else _pool(slot.dtype, slot.shape)
                outputs[slot.name] = {"channel": rng.choice(pool), "public": rng.random() < 0.5}
        if inputs:
            step["extra_inputs"] = inputs
        if outputs:
            step["extra_outputs"] = outputs
        out.append(step)
    return {"name": "random_graph", "in_features": WIDTH, "ops": out}


def fuser_segments(model: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """The op steps of each fuser: runs between module steps, as ``te.ops.Sequential`` groups them."""
    segments: list[list[dict[str, Any]]] = [[]]
    for step in model["ops"]:
        if "module" in step:
            segments.append([])
        else:
            segments[-1].append(step)
    return [s for s in segments if s]


def produced_in_two_fusers(model: dict[str, Any]) -> bool:
    """A channel name produced in two different fusers: TE accepts it (each fuser resolves locally),
    te_assembly's validator rejects it on purpose (channel names are model-wide)."""
    seen: dict[str, int] = {}
    for index, segment in enumerate(fuser_segments(model)):
        for step in segment:
            for binding in (step.get("extra_outputs") or {}).values():
                first = seen.setdefault(binding["channel"], index)
                if first != index:
                    return True
    return False
