"""Catalog entries for side branches on the main path: a branch that needs the tensor the main path
held earlier (a shared expert beside the routed ones) runs on the main path itself, between a
``MakeExtraOutput`` that keeps the earlier tensor and a ``SwapExtraInput`` that brings it back. TE ships
neither op; both run as reference ops inside TE's fuser (``engines/te/adapter.py``). ``ConcatExtraInput``
packs a branch's result beside the main path (the queries and the compressed key/value latent that
``LatentAttention`` takes as one tensor)."""

from __future__ import annotations

from te_assembly.catalog.costs import MOVES, Cost
from te_assembly.catalog.spec import Formula, OpSpec, Param, Slot, Width

_REF = "te_assembly.engines.reference.ops.branch"

BRANCH_OPS: tuple[OpSpec, ...] = (
    OpSpec(
        name="SigmoidGate",
        doc="y = x * sigmoid(gate_input @ weight^T): a learned scalar gate per row, computed from another "
        "tensor (Qwen2-MoE's shared_expert_gate on the normalised layer input).",
        params=(Param("in_features", int, doc="Features of gate_input (and of x)."),),
        inputs=(Slot("gate_input", "float", doc="The tensor the gate reads, shaped like x."),),
        width=Width(in_arg="in_features"),
        reference=f"{_REF}:SigmoidGate",
        param_shapes=lambda a: {"weight": (1, a["in_features"])},
        te_runs_on_cpu=True,
        cost=Cost(flops=lambda a, w: 2 * w.rows * int(a["in_features"]), note="2 * rows * in_features"),
    ),
    OpSpec(
        name="SwapExtraInput",
        doc="The main path leaves on extra output out, and extra input value becomes the main path: "
        "y = value. Ends a side branch (its result kept on a channel) and resumes with the tensor a "
        "MakeExtraOutput kept before it; value may be wider or narrower than x (value_features), as "
        "when a latent projection is kept and the layer input resumes.",
        params=(
            Param(
                "value_features",
                (int, type(None)),
                None,
                doc="Width of value, and of the main path after the op; null: the width arriving.",
            ),
        ),
        inputs=(
            Slot(
                "value",
                "float",
                width_arg="value_features",
                doc="The tensor that becomes the main path (x's width unless value_features says).",
            ),
        ),
        outputs=(Slot("out", "float", doc="The main-path tensor the op was given."),),
        width=Width(out_arg="value_features"),
        reference=f"{_REF}:SwapExtraInput",
        te_runs_on_cpu=True,
        cost=MOVES,
    ),
    OpSpec(
        name="ConcatExtraInput",
        doc="y = [x | tail] along the features: extra input tail (same leading dimensions, tail_features "
        "wide) appended after the main path's in_features. Packs what a module takes as one tensor, as "
        "LatentAttention's queries and compressed key/value latent.",
        params=(
            Param("in_features", int, doc="Features of the main path arriving at the op."),
            Param("tail_features", int, doc="Features of tail, placed after them."),
        ),
        inputs=(
            Slot("tail", "float", width_arg="tail_features", doc="The tensor appended after x's features."),
        ),
        width=Width(in_arg="in_features", out_formula=Formula("in_features + tail_features")),
        reference=f"{_REF}:ConcatExtraInput",
        te_runs_on_cpu=True,
        cost=MOVES,
    ),
)
