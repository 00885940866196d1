"""The checks of a config that read the model against another section, or one section's values against
another's: the recipe's shapes and the parallel layout, TE's fusion near misses, numbers a dtype cannot
hold, engine options, whole sequences."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from te_assembly.analysis.fusions import FusionTarget, near_miss_warnings, predict
from te_assembly.analysis.parallel.layout import ShardPlan, shard_plan
from te_assembly.analysis.parallel.settings import (
    TE_SHARDED_EXPERTS,
    TE_SHARDED_EXPERTS_HINT,
    ParallelSettings,
)
from te_assembly.analysis.plan import Plan
from te_assembly.analysis.recipe_shapes import recipe_shape_diagnostics
from te_assembly.analysis.recipes import Recipe
from te_assembly.catalog import LAYOUTS
from te_assembly.diagnostics import Diagnostic, error

COMMON = ""
"""Section name of the top-level settings (engine, kernels, device, dtype, seed)."""

FUSIONS = "fusions"
PARALLEL = "parallel"
"""Section name of the parallel layout (``torchrun``'s processes)."""


def cross_checks(
    plan: Plan | None, recipe: Recipe | None, parallel: ParallelSettings | None
) -> tuple[list[Diagnostic], ShardPlan | None]:
    """Checks of the model against another section, run once the model plans: the recipe's shape rules
    (``recipe_shapes.py``) and the parallel layout (``parallel/layout.py``: divisibility, tensor-parallel
    regions, expert rules, at every size once a step is marked). Whether this process was launched with
    the layout's ranks is no property of the config: the commands check that
    (``engines/parallel/runtime.py``)."""
    out: list[Diagnostic] = []
    layout = None
    if plan is not None and recipe is not None:
        out.extend(recipe_shape_diagnostics(plan.steps, recipe))
    if plan is not None and parallel is not None:
        layout, found = shard_plan(plan, parallel)
        out.extend(found)
    return out, layout


def fusion_warnings(plan: Plan | None, recipe: Recipe | None, parsed: Mapping[str, Any]) -> list[Diagnostic]:
    """``fusions.warn=true``: each near miss of TE's fused ops, for ``fusions.target``."""
    settings = parsed.get(FUSIONS)
    if plan is None or settings is None or not settings.warn:
        return []
    common, parallel = parsed.get(COMMON), parsed.get(PARALLEL)
    target = FusionTarget.of(
        settings.target,
        recipe=recipe,
        dtype=str(getattr(common, "dtype", "float32")),
        kernels=str(getattr(common, "kernels", "te")),
        tensor_parallel=int(getattr(parallel, "tensor", 1)),
    )
    return near_miss_warnings(plan, predict(plan, target))


TOKEN_KEYS = {"run": "tokens", "train": "batch_tokens", "bench": "tokens"}
"""Each section that makes synthetic batches: its rows-per-batch key (next to its ``seq_len``)."""


DTYPE_MAX = {
    "float32": 3.4028234663852886e38,
    "bfloat16": 3.3895313892515355e38,
    "float64": 1.7976931348623157e308,
}
"""The largest finite value of each ``dtype`` setting (``torch.finfo(...).max``), without torch."""

SCALED_BY_DTYPE = {"train": ("lr", "weight_decay", "momentum"), "bench": ("lr",)}
"""Settings an optimizer multiplies into the parameters, in the model's dtype."""


def dtype_range_checks(parsed: Mapping[str, Any]) -> list[Diagnostic]:
    """A learning rate (or weight decay, momentum) finite in float64 but not in the model's dtype makes
    the first update infinite: a config error, not a NaN at step 1."""
    common = parsed.get(COMMON)
    dtype = getattr(common, "dtype", None)
    largest = DTYPE_MAX.get(str(dtype))
    if largest is None:
        return []
    out = []
    for section, keys in SCALED_BY_DTYPE.items():
        settings = parsed.get(section)
        for key in keys:
            value = getattr(settings, key, None)
            if isinstance(value, float) and abs(value) > largest:
                out.append(
                    error(
                        f"{section}.{key}",
                        "out-of-range",
                        f"{section}.{key}={value:g} is not a finite number in {dtype} (its largest is "
                        f"{largest:.4g}): the first optimizer step would make every parameter infinite",
                        f"choose a {section}.{key} below {largest:.4g}, or dtype=float64",
                    )
                )
    return out


def engine_option_checks(parsed: Mapping[str, Any], recipe: Recipe | None) -> list[Diagnostic]:
    """What the TE engine cannot do yet, refused before anything is built: ``torch.compile`` of TE's
    fusers (TE issue #2590), and FSDP2 or activation checkpointing of quantized weights (TE issue
    #2713: ``te.ops`` has no FSDP2 support; FP8 scales would be recomputed from other amaxes)."""
    common = parsed.get(COMMON)
    if getattr(common, "engine", None) != "te":
        return []
    out = []
    if getattr(common, "compile", False):
        out.append(
            error(
                "compile",
                "conflicting-settings",
                "compile=true with engine=te: torch.compile does not trace TE's fusible ops yet (TE issue "
                "#2590: graph breaks at every fuser)",
                "use engine=reference with compile=true, or compile=false",
            )
        )
    quantized = recipe is not None and recipe.kind != "none"
    sharded = getattr(parsed.get(PARALLEL), "shard", 1) > 1
    if quantized and sharded:
        out.append(
            error(
                "parallel.shard",
                "conflicting-settings",
                f"parallel.shard with recipe {recipe.name if recipe else ''!r} on the TE engine: FSDP2 "
                "would gather quantized (FP8) weights and their scales, which te.ops does not support "
                "(TE issue #2713)",
                "drop the recipe (recipe=null) for a sharded run, or use parallel.data instead",
            )
        )
    if sharded and getattr(parsed.get(PARALLEL), "expert", 1) > 1:
        out.append(
            error("parallel.shard", "conflicting-settings", TE_SHARDED_EXPERTS, TE_SHARDED_EXPERTS_HINT)
        )
    checkpointing = getattr(parsed.get("train"), "activation_checkpointing", "none")
    if quantized and checkpointing != "none":
        out.append(
            error(
                "train.activation_checkpointing",
                "conflicting-settings",
                f"train.activation_checkpointing={checkpointing} with recipe "
                f"{recipe.name if recipe else ''!r} on the TE engine: recomputing a quantized forward "
                "would quantize again with scales the first forward already advanced",
                "drop the recipe, or train.activation_checkpointing=none",
            )
        )
    return out


def checkpoint_checks(parsed: Mapping[str, Any]) -> list[Diagnostic]:
    """``train.async_checkpoint`` writes DCP's pieces under each tensor's whole-model name: a
    tensor-parallel rank's slice of a weight would share that name with the other ranks' slices."""
    tensor = getattr(parsed.get(PARALLEL), "tensor", 1)
    if not getattr(parsed.get("train"), "async_checkpoint", False) or tensor == 1:
        return []
    return [
        error(
            "train.async_checkpoint",
            "conflicting-settings",
            f"train.async_checkpoint=true with parallel.tensor={tensor}: a background checkpoint is written "
            "as DCP pieces under whole-tensor names, and tensor parallelism cuts weights by hand into "
            "slices DCP does not know apart",
            "train.async_checkpoint=false (rank 0 then gathers and writes), or parallel.data, "
            "parallel.shard or parallel.expert instead of parallel.tensor",
        )
    ]


def sequence_checks(plan: Plan | None, parsed: Mapping[str, Any]) -> list[Diagnostic]:
    """A model that takes ``[batch, seq, features]`` needs whole sequences: each section's tokens a
    multiple of its ``seq_len``."""
    if plan is None or not plan.takes_sequences:
        return []
    out = []
    for section, key in TOKEN_KEYS.items():
        settings = parsed.get(section)
        if settings is not None and hasattr(settings, "for_task"):  # train: null is the task's default
            settings = settings.for_task(plan.takes_token_ids)
        tokens, seq_len = getattr(settings, key, None), getattr(settings, "seq_len", None)
        if not isinstance(tokens, int) or not isinstance(seq_len, int) or tokens % seq_len == 0:
            continue
        whole = max(seq_len, tokens - tokens % seq_len)
        out.append(
            error(
                f"{section}.{key}",
                "partial-sequence",
                f"{plan.name} takes x as {LAYOUTS[plan.input_layout]} ({plan.input_layout_source}): "
                f"{section}.{key}={tokens} rows are not whole sequences of {section}.seq_len={seq_len} "
                "positions",
                f"use {section}.{key}={whole}, or a {section}.seq_len that divides {tokens}",
            )
        )
    return out
