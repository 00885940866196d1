"""TE 2.20's fused operations as data: the basic ops each replaces and the conditions it needs.

TE's ``OperationFuser`` scans a fuser's basic ops (in forward order) with one function per fused op,
in registration order (``transformer_engine/pytorch/ops/fused/__init__.py``): the joint
forward+backward fusions first, then the forward-only ones on that result, then the backward-only ones.
Each function slides a window from the left and replaces the first run that matches with its fused
op, which no later pattern matches again. ``analysis/fusions.py`` runs the same scan on a plan; the te
tier checks it against TE's own functions on CPU.

Pure data, like the rest of the catalog: no torch, no TE.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SOURCE = "transformer_engine/pytorch/ops/fused/"


@dataclass(frozen=True)
class Member:
    """One basic op of a pattern."""

    types: tuple[str, ...]
    """Catalog basic-op names that match (TE's isinstance check)."""
    optional: bool = False
    """Taken when it is there (ForwardLinearBiasAdd's Bias), skipped otherwise."""
    args: tuple[tuple[str, Any], ...] = ()
    """(argument, value) the op must have, e.g. ``("in_place", True)``."""
    not_tensor_parallel: tuple[str, ...] = ()
    """``tensor_parallel_mode`` values with which it does not fuse (TE communicates around the GEMM)."""
    in_fused_op: bool = True
    """False for a member TE only looks at (BackwardActivationBias's first op, which stays as it is)."""


@dataclass(frozen=True)
class Fusion:
    name: str
    """TE's class name."""
    passes: str
    """``joint`` (forward and backward), ``forward`` or ``backward``."""
    members: tuple[Member, ...]
    source: str
    """TE's source file."""
    recipe: str = "any"
    """``any``: with or without a quantization recipe; ``required``: only under one (and with no
    ``backward_override``); or a comma-separated list of the recipe kinds it needs."""
    weight_dtypes: tuple[str, ...] = ()
    """The first member's weight dtype must be one of these (empty: any)."""
    capability_major: int | None = None
    """The GPU's compute capability major version it needs (10: Blackwell)."""
    env: tuple[tuple[str, str], ...] = ()
    """Environment variables that must be set to these values."""
    dims_multiple: int | None = None
    """Every GroupedLinear member's in and out features must be multiples of this."""
    glu_pair: bool = False
    """The first GroupedLinear's out features are twice the second's in features (a GLU between)."""
    userbuffers: bool = False
    """Needs TE's Userbuffers communication overlap, which te_assembly never sets up."""
    doc: str = ""


_LINEAR = ("BasicLinear",)
_ACTIVATIONS = ("GELU", "GEGLU", "QGELU", "QGEGLU", "ReLU", "ReGLU", "SReLU", "SReGLU", "SiLU", "SwiGLU")
"""TE's ``_fusible_activations`` (backward_activation_bias.py) that the catalog has."""

FUSIONS: tuple[Fusion, ...] = (
    Fusion(
        "GroupedMLP_CuTeGEMMGLU",
        "joint",
        (
            Member(("GroupedLinear",)),
            Member(("ScaledSwiGLU", "ScaledClampedQGeGLU"), args=(("glu_interleave_size", 32),)),
            Member(("GroupedLinear",)),
        ),
        SOURCE + "grouped_mlp.py",
        recipe="MXFP8BlockScaling,NVFP4BlockScaling",
        capability_major=10,
        env=(("NVTE_CUTEDSL_FUSED_GROUPED_MLP", "1"),),
        dims_multiple=64,
        glu_pair=True,
        doc="A mixture of experts' GroupedLinear, gated activation and GroupedLinear in one CuTe DSL "
        "kernel pair (experimental in TE 2.20); also needs the cuDNN front end's grouped GEMMs.",
    ),
    Fusion(
        "UserbuffersForwardLinear",
        "forward",
        (Member(_LINEAR),),
        SOURCE + "userbuffers_forward_linear.py",
        userbuffers=True,
        doc="A tensor-parallel Linear with its communication overlapped through Userbuffers.",
    ),
    Fusion(
        "ForwardLinearBiasAdd",
        "forward",
        (
            Member(_LINEAR, not_tensor_parallel=("row",)),
            Member(("Bias",), optional=True),
            Member(("AddExtraInput",), args=(("in_place", True),)),
        ),
        SOURCE + "forward_linear_bias_add.py",
        doc="The GEMM writes into the addend (a residual) and the bias is added in its epilogue.",
    ),
    Fusion(
        "ForwardLinearBiasActivation",
        "forward",
        (Member(_LINEAR, not_tensor_parallel=("row",)), Member(("Bias",))),
        SOURCE + "forward_linear_bias_activation.py",
        weight_dtypes=("bfloat16", "float16"),
        doc="The bias added in the GEMM's epilogue (TE 2.20 fuses no activation here).",
    ),
    Fusion(
        "ForwardLinearScaleAdd",
        "forward",
        (
            Member(_LINEAR, not_tensor_parallel=("row",)),
            Member(("ConstantScale",)),
            Member(("AddExtraInput",), args=(("in_place", True),)),
        ),
        SOURCE + "forward_linear_scale_add.py",
        doc="out = addend + scale * (x W^T), the GEMM accumulating into the addend.",
    ),
    Fusion(
        "UserbuffersBackwardLinear",
        "backward",
        (Member(_LINEAR),),
        SOURCE + "userbuffers_backward_linear.py",
        userbuffers=True,
        doc="A tensor-parallel Linear's backward with its communication overlapped through Userbuffers.",
    ),
    Fusion(
        "BackwardLinearAdd",
        "backward",
        (
            Member(("MakeExtraOutput",), args=(("in_place", True),)),
            Member(_LINEAR, not_tensor_parallel=("column",)),
        ),
        SOURCE + "backward_linear_add.py",
        doc="The Linear's dgrad GEMM accumulates straight into the tapped tensor's gradient.",
    ),
    Fusion(
        "BackwardLinearScale",
        "backward",
        (Member(_LINEAR, not_tensor_parallel=("column",)), Member(("ConstantScale",))),
        SOURCE + "backward_linear_scale.py",
        doc="The constant scale folded into the Linear's backward GEMMs.",
    ),
    Fusion(
        "BackwardActivationBias",
        "backward",
        (Member(_LINEAR, in_fused_op=False), Member(("Bias",)), Member(_ACTIVATIONS)),
        SOURCE + "backward_activation_bias.py",
        recipe="required",
        doc="dbias and the activation's backward in one kernel that also quantizes the gradient for the "
        "Linear before them (which must quantize its grad output: a recipe).",
    ),
    Fusion(
        "BackwardAddRMSNorm",
        "backward",
        (Member(("MakeExtraOutput",), args=(("in_place", False),)), Member(("RMSNorm",))),
        SOURCE + "backward_add_rmsnorm.py",
        doc="The residual's gradient added inside RMSNorm's backward kernel.",
    ),
)
"""In TE's order: joint, then forward, then backward, each pass in registration order."""

__all__ = ["FUSIONS", "SOURCE", "Fusion", "Member"]
