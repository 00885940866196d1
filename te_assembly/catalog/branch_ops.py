"""Catalog entries for side branches on the main path: a branch that needs the tensor the main path
held earlier (a shared expert beside the routed ones) runs on the main path itself, between a
``MakeExtraOutput`` that keeps the earlier tensor and a ``SwapExtraInput`` that brings it back. TE ships
neither op; both run as reference ops inside TE's fuser (``engines/te/adapter.py``)."""

from __future__ import annotations

from te_assembly.catalog.spec import OpSpec, Param, Slot, Width

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
    ),
    OpSpec(
        name="SwapExtraInput",
        doc="The main path leaves on extra output out, and extra input value becomes the main path: "
        "y = value. Ends a side branch (its result kept on a channel) and resumes with the tensor a "
        "MakeExtraOutput kept before it.",
        inputs=(Slot("value", "float", doc="The tensor that becomes the main path, shaped like x."),),
        outputs=(Slot("out", "float", doc="The main-path tensor the op was given."),),
        reference=f"{_REF}:SwapExtraInput",
        te_runs_on_cpu=True,
    ),
)
