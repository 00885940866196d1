"""Catalog entries for Transformer Engine's own fusible ops (``transformer_engine.pytorch.ops``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from te_assembly.catalog.costs import MOVES, linear
from te_assembly.catalog.spec import OpSpec, Param, Slot, Width

_EPS = (0.0, 1.0)
"""A norm's epsilon: real models use 1e-5 to 1e-12; a value of 1 or more swamps the variance it is added
to (``1e300`` makes every output 0), so it is refused at config time."""
_EPS_DOC = "Added to the variance before the square root (0 to 1; models use 1e-5 or 1e-6)."
_TE = "transformer_engine.pytorch.ops"
_REF = "te_assembly.engines.reference.ops"


def _linear_basic_ops(args: Mapping[str, Any]) -> tuple[tuple[str, dict[str, Any]], ...]:
    # te.ops.Linear is a FusedOperation: BasicLinear, then Bias when bias=True.
    ops: list[tuple[str, dict[str, Any]]] = [
        ("BasicLinear", {"in_features": args["in_features"], "out_features": args["out_features"]})
    ]
    if args.get("bias", True):
        ops.append(("Bias", {"size": args["out_features"]}))
    return tuple(ops)


def _linear_params(args: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {"basic_ops.0.weight": (args["out_features"], args["in_features"])}
    if args.get("bias", True):
        shapes["basic_ops.1.bias"] = (args["out_features"],)
    return shapes


def _grouped_params(args: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for g in range(args["num_groups"]):
        shapes[f"weight{g}"] = (args["out_features"], args["in_features"])
    if args.get("bias", True):
        for g in range(args["num_groups"]):
            shapes[f"bias{g}"] = (args["out_features"],)
    return shapes


def _norm_params(with_bias: bool):  # type: ignore[no-untyped-def]
    def shapes(args: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
        out: dict[str, tuple[int, ...]] = {"weight": (args["normalized_shape"],)}
        if with_bias:
            out["bias"] = (args["normalized_shape"],)
        return out

    return shapes


_IN_PLACE = Param("in_place", bool, False, doc="Alias the channel tensor instead of copying (TE hazard).")
# TE's own constructor argument. It only acts under parallel.tensor > 1, where engines/parallel/ builds
# the split op with TE's tensor_parallel_group and sequence_parallel (catalog/sharding.py); alone, a no-op.
_TP_MODE = Param(
    "tensor_parallel_mode",
    (str, type(None)),
    None,
    choices=(None, "column", "row"),
    doc="Tensor parallelism: column splits out_features, row splits in_features (TE's tensor_parallel_mode).",
)


def _activation(name: str, doc: str, gated: bool) -> OpSpec:
    return OpSpec(
        name=name,
        doc=doc,
        width=Width(divisor=2 if gated else 1),
        te_class=f"{_TE}:{name}",
        reference=f"{_REF}.activations:{name}",
        token_wise=True,
    )


_CLAMPED = (
    Param("limit", float, 7.0, bounds=(0.0, 1e6), doc="Clamp limit (GPT-OSS's swiglu_limit)."),
    Param("alpha", float, 1.702, bounds=(0.0, 1e6), doc="Sigmoid scale (GPT-OSS's swiglu_alpha)."),
    Param("glu_linear_offset", float, 1.0, bounds=(-1e6, 1e6), doc="Added to b after clamping."),
)

TE_OPS: tuple[OpSpec, ...] = (
    OpSpec(
        name="Linear",
        token_wise=True,
        doc="y = x W^T + b. A TE fused op: expands to BasicLinear (+ Bias).",
        params=(Param("in_features", int), Param("out_features", int), Param("bias", bool, True), _TP_MODE),
        width=Width(in_arg="in_features", out_arg="out_features"),
        te_class=f"{_TE}:Linear",
        reference=f"{_REF}.linear:Linear",
        expands_to=_linear_basic_ops,
        param_shapes=_linear_params,
        validation_only_params=("tensor_parallel_mode",),
        tie_param="basic_ops.0.weight",
        cost=linear(),
    ),
    OpSpec(
        name="BasicLinear",
        token_wise=True,
        doc="y = x W^T, no bias.",
        params=(Param("in_features", int), Param("out_features", int), _TP_MODE),
        width=Width(in_arg="in_features", out_arg="out_features"),
        te_class=f"{_TE}:BasicLinear",
        reference=f"{_REF}.linear:BasicLinear",
        param_shapes=lambda a: {"weight": (a["out_features"], a["in_features"])},
        cost=linear(),
        validation_only_params=("tensor_parallel_mode",),
        tie_param="weight",
    ),
    OpSpec(
        name="Bias",
        token_wise=True,
        doc="y = x + b.",
        params=(Param("size", int),),
        width=Width(in_arg="size"),
        te_class=f"{_TE}:Bias",
        reference=f"{_REF}.linear:Bias",
        param_shapes=lambda a: {"bias": (a["size"],)},
        te_runs_on_cpu=True,
        cost=MOVES,
    ),
    OpSpec(
        name="GroupedLinear",
        doc="One linear layer per group of rows; rows are split by the split_sizes input.",
        params=(
            Param("num_groups", int),
            Param("in_features", int),
            Param("out_features", int),
            Param("bias", bool, True),
            Param("scale_bias", bool, False, doc="Add bias * scales (a second input slot)."),
        ),
        inputs=(
            Slot(
                "split_sizes",
                "int",
                agree=(("groups", "num_groups"),),
                shape="groups",
                doc="Rows per group (int64).",
            ),
            Slot(
                "scales", "float", enabled_if=("scale_bias", "bias"), shape="rows", doc="Per-row bias scales."
            ),
        ),
        width=Width(in_arg="in_features", out_arg="out_features"),
        te_class=f"{_TE}:GroupedLinear",
        reference=f"{_REF}.linear:GroupedLinear",
        param_shapes=_grouped_params,
        cost=linear(),
    ),
    OpSpec(
        name="LayerNorm",
        token_wise=True,
        doc="Layer normalization over the last dimension.",
        params=(
            Param("normalized_shape", int),
            Param("eps", float, 1e-5, bounds=_EPS, doc=_EPS_DOC),
            Param("zero_centered_gamma", bool, False),
        ),
        width=Width(in_arg="normalized_shape"),
        te_class=f"{_TE}:LayerNorm",
        reference=f"{_REF}.norms:LayerNorm",
        param_shapes=_norm_params(with_bias=True),
    ),
    OpSpec(
        name="RMSNorm",
        token_wise=True,
        doc="RMS normalization over the last dimension.",
        params=(
            Param("normalized_shape", int),
            Param("eps", float, 1e-5, bounds=_EPS, doc=_EPS_DOC),
            Param("zero_centered_gamma", bool, False),
        ),
        width=Width(in_arg="normalized_shape"),
        te_class=f"{_TE}:RMSNorm",
        reference=f"{_REF}.norms:RMSNorm",
        param_shapes=_norm_params(with_bias=False),
    ),
    _activation("GELU", "GELU, tanh approximation.", gated=False),
    _activation("QGELU", "Quick GELU: x * sigmoid(1.702 x).", gated=False),
    _activation("ReLU", "max(x, 0).", gated=False),
    _activation("SReLU", "Squared ReLU.", gated=False),
    _activation("SiLU", "x * sigmoid(x).", gated=False),
    _activation("SwiGLU", "SiLU(a) * b with x = [a, b]; halves the width.", gated=True),
    _activation("GEGLU", "GELU(a) * b with x = [a, b]; halves the width.", gated=True),
    _activation("QGEGLU", "QGELU(a) * b with x = [a, b]; halves the width.", gated=True),
    _activation("ReGLU", "ReLU(a) * b with x = [a, b]; halves the width.", gated=True),
    _activation("SReGLU", "SReLU(a) * b with x = [a, b]; halves the width.", gated=True),
    OpSpec(
        name="ScaledSwiGLU",
        doc="SwiGLU(x) * scales[..., None]: per-row post-scaling, e.g. by router probabilities.",
        inputs=(Slot("scales", "float", shape="rows", doc="One scale per row."),),
        width=Width(divisor=2),
        te_class=f"{_TE}:ScaledSwiGLU",
        reference=f"{_REF}.activations:ScaledSwiGLU",
    ),
    OpSpec(
        name="ClampedSwiGLU",
        token_wise=True,
        doc="GPT-OSS's gated activation with x = [a, b] (halves): a clamped to at most limit, b to "
        "[-limit, limit]; a * sigmoid(alpha * a) * (b + glu_linear_offset). Halves the width.",
        params=_CLAMPED,
        width=Width(divisor=2),
        te_class=f"{_TE}:ClampedSwiGLU",
        reference=f"{_REF}.activations:ClampedSwiGLU",
    ),
    OpSpec(
        name="ScaledClampedQGeGLU",
        doc="ClampedSwiGLU(x) * scales[..., None]: GPT-OSS's expert activation, post-scaled per row by "
        "router probabilities (TE's name: the clamped quick-GELU GLU of cuDNN's grouped GEMM).",
        params=_CLAMPED,
        inputs=(Slot("scales", "float", shape="rows", doc="One scale per row."),),
        width=Width(divisor=2),
        te_class=f"{_TE}:ScaledClampedQGeGLU",
        reference=f"{_REF}.activations:ScaledClampedQGeGLU",
    ),
    OpSpec(
        name="MakeExtraOutput",
        token_wise=True,
        doc="Pass x through and also emit it as an extra output (e.g. a residual).",
        params=(_IN_PLACE,),
        outputs=(Slot("out", "float", doc="The tensor itself."),),
        te_class=f"{_TE}:MakeExtraOutput",
        reference=f"{_REF}.passthrough:MakeExtraOutput",
        te_runs_on_cpu=True,
        in_place_arg=True,
        cost=MOVES,
    ),
    OpSpec(
        name="AddExtraInput",
        token_wise=True,
        doc="y = x + addend.",
        params=(_IN_PLACE,),
        inputs=(Slot("addend", "float", doc="Tensor of x's shape."),),
        te_class=f"{_TE}:AddExtraInput",
        reference=f"{_REF}.passthrough:AddExtraInput",
        te_runs_on_cpu=True,
        in_place_arg=True,
        cost=MOVES,
    ),
    OpSpec(
        name="ConstantScale",
        token_wise=True,
        doc="y = scale * x.",
        params=(Param("scale", float),),
        te_class=f"{_TE}:ConstantScale",
        reference=f"{_REF}.passthrough:ConstantScale",
        te_runs_on_cpu=True,
        cost=MOVES,
    ),
    OpSpec(
        name="Identity",
        token_wise=True,
        doc="y = x.",
        te_class=f"{_TE}:Identity",
        reference=f"{_REF}.passthrough:Identity",
        te_runs_on_cpu=True,
        cost=MOVES,
    ),
    OpSpec(
        name="Dropout",
        token_wise=True,
        doc="Dropout with probability p (identity in eval mode).",
        params=(Param("p", float, bounds=(0.0, 1.0)),),
        te_class=f"{_TE}:Dropout",
        reference=f"{_REF}.passthrough:Dropout",
    ),
)
