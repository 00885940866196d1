"""Catalog entries for LoRA adapters: a low-rank side branch beside a frozen projection.

The branch reads the projection's input from a channel (a ``MakeExtraOutput`` before the projection
keeps it) and adds ``scaling * B(A(dropout(x)))`` to the projection's output, so the projection itself
stays one op (one TE fused op in its fuser) and the adapter is the step after it. A stacked projection
(``qkv`` = q | k | v rows, ``fc1`` = gate | up rows) takes one adapter per part, as PEFT adapts
``q_proj``, ``k_proj`` and ``v_proj`` separately: ``parts`` lists the widths and ``adapted`` which of
them carry one. ``analysis/adapters.py`` inserts both steps for the ``lora:`` section; they can also be
written by hand. TE ships no such op: it runs as a reference op inside TE's fuser, in the parameters'
precision (outside a quantization recipe's FP8 GEMMs).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from te_assembly.catalog.costs import per_row_weights
from te_assembly.catalog.spec import OpSpec, Param, Slot, Width

_REF = "te_assembly.engines.reference.ops.adapters"
BASE_WEIGHT = "base_weight"
"""DoRA's view of the adapted projection's weight: tied to it, never a parameter of its own."""
MAGNITUDE = "lora_magnitude"
"""DoRA's magnitude of each output row of an adapted part (PEFT's ``lora_magnitude_vector``)."""


def parts_of(args: Mapping[str, Any]) -> list[int]:
    """The widths of the output's parts, each adapted on its own (one part: the whole output)."""
    parts = args.get("parts")
    return list(parts) if parts else [int(args["out_features"])]


def adapted_parts(args: Mapping[str, Any]) -> list[int]:
    """The indices of the parts that carry an adapter."""
    adapted = args.get("adapted")
    count = len(parts_of(args))
    return [i for i in range(count) if adapted is None or bool(adapted[i])]


def scaling(args: Mapping[str, Any]) -> float:
    """What the adapter's output is multiplied by: ``alpha / rank`` (PEFT's default), or ``alpha /
    sqrt(rank)`` with ``rslora`` (rank-stabilised LoRA)."""
    rank = float(args["rank"])
    return float(args["alpha"]) / (rank**0.5 if args.get("rslora") else rank)


def _lora_matrices(args: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """A and B of every adapted part; with DoRA the projection's weight too (it multiplies x again)."""
    parts, rank = parts_of(args), int(args["rank"])
    shapes: dict[str, tuple[int, ...]] = {}
    for i in adapted_parts(args):
        shapes[f"lora_A{i}"] = (rank, int(args["in_features"]))
        shapes[f"lora_B{i}"] = (parts[i], rank)
    if args.get("dora"):
        shapes[BASE_WEIGHT] = (int(args["out_features"]), int(args["in_features"]))
    return shapes


def _lora_shapes(args: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    shapes = _lora_matrices(args)
    if args.get("dora"):
        parts = parts_of(args)
        shapes.update({f"{MAGNITUDE}{i}": (parts[i],) for i in adapted_parts(args)})
    return shapes


def _grouped_shapes(args: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    one = _lora_shapes(args)
    return {f"{name}_{g}": shape for g in range(int(args["num_groups"])) for name, shape in one.items()}


def _check_parts(args: Mapping[str, Any]) -> list[tuple[str, str, str | None]]:
    out: list[tuple[str, str, str | None]] = []
    parts, adapted, width = args.get("parts"), args.get("adapted"), args.get("out_features")
    if parts is not None and isinstance(width, int) and sum(parts) != width:
        shown = " + ".join(map(str, parts))
        out.append(("parts", f"parts {shown} = {sum(parts)} but out_features={width}", "make them sum to it"))
    if adapted is not None and len(adapted) != len(parts_of(args)):
        message = f"adapted has {len(adapted)} entries for {len(parts_of(args))} part(s)"
        out.append(("adapted", message, "one true/false per part"))
    elif adapted is not None and not any(adapted):
        out.append(("adapted", "no part is adapted", "set at least one entry true, or remove the step"))
    rank = args.get("rank")
    if isinstance(rank, int) and parts is not None and any(rank > p for p in parts):
        message = f"rank={rank} is wider than a part ({min(parts)} rows): the update would not be low-rank"
        out.append(("rank", message, f"use a rank of at most {min(parts)}"))
    return out


_COMMON = (
    Param("in_features", int, doc="Width of the adapted projection's input (the x slot)."),
    Param("out_features", int, doc="Width of the adapted projection's output (the main path)."),
    Param("rank", int, doc="The adapter's rank r: A is [r, in_features], B is [part, r]."),
    Param("alpha", float, 16.0, doc="Scaling numerator: the update is multiplied by alpha / rank."),
    Param("dropout", float, 0.0, bounds=(0.0, 0.99), doc="Dropout on x before A, in training only."),
    Param("rslora", bool, False, doc="Rank-stabilised LoRA: scale by alpha / sqrt(rank) instead."),
    Param(
        "parts",
        (list, type(None)),
        None,
        items=int,
        doc="Widths of the stacked output's parts (q | k | v rows), each with its own adapter; "
        "null: one adapter over the whole output.",
    ),
    Param(
        "adapted",
        (list, type(None)),
        None,
        items=bool,
        doc="Which parts carry an adapter (PEFT's q_proj and v_proj but not k_proj); null: all.",
    ),
)
_RULES = (
    ("rank", "in_features", "a rank above the input width is not low-rank"),
    ("rank", "out_features", "a rank above the output width is not low-rank"),
)

ADAPTER_OPS: tuple[OpSpec, ...] = (
    OpSpec(
        name="LoRA",
        token_wise=True,
        doc="y = y + scaling * B(A(dropout(x))) per part of y, x the adapted projection's input (kept "
        "on a channel before it). PEFT's LoRA as a side branch: A starts random, B at zero. With dora, "
        "PEFT's DoRA: each output row of W + scaling * B A rescaled to a learned magnitude (lora_magnitude, "
        "starting at the row norms of W), the norm itself held constant in backward; the step then ties "
        "base_weight to the projection's weight (tie_weight) and multiplies x by it once more.",
        params=(
            *_COMMON,
            Param(
                "dora",
                bool,
                False,
                doc="Weight-decomposed LoRA (PEFT's use_dora): needs tie_weight: the adapted projection.",
            ),
        ),
        inputs=(Slot("x", "float", width_arg="in_features", doc="The adapted projection's input."),),
        width=Width(in_arg="out_features", out_arg="out_features"),
        reference=f"{_REF}:LoRA",
        param_shapes=_lora_shapes,
        tie_param=BASE_WEIGHT,
        tie_required="dora",
        cost=per_row_weights(_lora_matrices, None),
        te_runs_on_cpu=True,
        arg_rules=_RULES,
        arg_checks=_check_parts,
    ),
    OpSpec(
        name="GroupedLoRA",
        doc="LoRA beside a GroupedLinear: one adapter per group (expert), rows split by split_sizes "
        "as the GroupedLinear splits them.",
        params=(Param("num_groups", int, doc="Groups (experts), as the adapted GroupedLinear's."), *_COMMON),
        inputs=(
            Slot("x", "float", width_arg="in_features", doc="The adapted GroupedLinear's input."),
            Slot(
                "split_sizes",
                "int",
                agree=(("groups", "num_groups"),),
                shape="groups",
                doc="Rows per group, as the adapted GroupedLinear reads them.",
            ),
        ),
        width=Width(in_arg="out_features", out_arg="out_features"),
        reference=f"{_REF}:GroupedLoRA",
        param_shapes=_grouped_shapes,
        cost=per_row_weights(_grouped_shapes, "num_groups"),
        te_runs_on_cpu=True,
        arg_rules=_RULES,
        arg_checks=_check_parts,
    ),
)

ADAPTER_TYPES = frozenset(spec.name for spec in ADAPTER_OPS)
"""The ops whose parameters are an adapter's: a plan holding one trains only them."""
