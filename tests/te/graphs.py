"""Seeded random channel graphs (model mappings) of TE's CPU-capable ops and our MoE ops.

Channel names come from one pool per slot dtype, shape and row space (token rows, or rows after each
Dispatch/Combine: a channel may only join slots on the same side of them), and every op keeps the
width and uses the same MoE arguments, so the only rules a graph can break are the ones TE itself
enforces (dangling input, producer at or after the consumer, several producers). When modules split
it, a channel may also be read in a later fuser than its producer's: TE alone rejects that (the
consumer's fuser has no producer), te_assembly carries it across (``plan.Reroute``).
``tests/validation/test_random_graph_generator.py`` holds the generator to that claim over many seeds.
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


ROW_SHAPES = ("main", "rows", "token_topk")
"""Slot shapes with one entry per row of the main path: they only fit at the same row depth."""


def _pool(dtype: str, shape: str, depth: int = 0) -> tuple[str, ...]:
    # Shapes TE does not check at construction (a [tokens, top_k] tensor into a per-row slot, a tensor of
    # token rows into a step that runs on dispatched rows) keep pools apart, like dtypes: the main-path
    # pool at token rows keeps the plain names.
    names = FLOAT_POOL if dtype == "float" else INT_POOL
    if shape != "main":
        names = tuple(f"{n}_{shape}" for n in names)
    if depth and shape in ROW_SHAPES:
        names = tuple(f"{n}_depth{depth}".replace("-", "m") for n in names)
    return names


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
    depth = 0  # Dispatches minus Combines so far: the row space of the main path
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
            slot.name: (rng.choice(_pool(slot.dtype, slot.shape, depth)) if rng.random() < bind else None)
            for slot in spec.input_slots(args)
        }
        outputs = {}
        for slot in spec.output_slots(args):
            if rng.random() < bind:
                # Dispatch's row outputs (row_probs, row_map) describe the rows it emits.
                made_at = depth + (spec.rows_delta if slot.shape == "rows" else 0)
                pool = _pool(slot.dtype, slot.shape, made_at)
                if runnable and op == "TopKRouter":
                    pool = ROUTER_POOL
                outputs[slot.name] = {"channel": rng.choice(pool), "public": rng.random() < 0.5}
        depth += spec.rows_delta
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
