"""Build the TE engine's model from a validated plan: construct, bind every channel, then fuse (and lock).

The order is the point: TE locks an op's channel bindings as soon as any ``OperationFuser`` captures
it, so every setter call happens before the first fuser exists, and every fuser is built here rather
than lazily at the first forward as ``te.ops.Sequential`` does.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from transformer_engine.pytorch.ops import FusibleOperation
from transformer_engine.pytorch.ops.fuser import OperationFuser

from te_assembly.analysis.plan import Plan, PlannedStep
from te_assembly.catalog import MODULE_ALLOWLIST, OPS, load_object
from te_assembly.engines.base import add_step, tie_weights
from te_assembly.engines.te.adapter import reference_op
from te_assembly.engines.te.bindings import binding_calls, gpu_only_steps
from te_assembly.engines.te.model import TEModel
from te_assembly.errors import ConfigError, EngineUnavailableError

if TYPE_CHECKING:
    from te_assembly.engines.parallel.context import ParallelContext

KERNELS = ("te", "reference")


def build_te(
    plan: Plan,
    kernels: str = "te",
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    recipe: Mapping[str, Any] | None = None,
    parallel: ParallelContext | None = None,
) -> TEModel:
    """The plan as TE fusers. ``kernels=te``: TE's own ops (our MoE ops through the reference adapter);
    ``kernels=reference``: every op through the adapter, so the whole model runs on CPU. ``recipe``: a
    recipe config (``analysis/recipes.py``), checked against this machine before anything is built.
    ``parallel``: this rank's split ops (``te_assembly.engines.parallel.context.ParallelContext.te_op``)."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    _check_machine(plan, kernels, dev)
    te_recipe = _prepare_recipe(plan, recipe)
    model = TEModel(plan, kernels, recipe, te_recipe)
    for step in plan.steps:
        split = parallel.te_op(step, kernels, dev, dtype) if parallel is not None else None
        if split is not None:
            _check_slots(step, split)
            model.head_splits |= plan.head is not None and step.index >= plan.head
        add_step(
            model.steps, step.name, split if split is not None else _construct(step, kernels, dev, dtype)
        )
    tie_weights(model.steps, plan)  # before any fuser lists the parameters
    for call in binding_calls(plan):
        call.apply(model.step_module(call.step))
    model.attach(_fuse(plan, model))
    return model


def _check_machine(plan: Plan, kernels: str, device: torch.device) -> None:
    if kernels not in KERNELS:
        raise EngineUnavailableError(f"unknown kernels {kernels!r}; choose one of {', '.join(KERNELS)}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise EngineUnavailableError(f"device={device} asked for, but no CUDA GPU is visible")
    if device.type == "cpu":
        needs_gpu = gpu_only_steps(plan, kernels)
        if needs_gpu:
            raise EngineUnavailableError(
                f"engine=te kernels=te on CPU: TE's kernels for step(s) {', '.join(needs_gpu)} need a CUDA "
                "GPU; use kernels=reference to run the reference math inside TE's fusers, or device=cuda"
            )


def _prepare_recipe(plan: Plan, recipe: Mapping[str, Any] | None) -> object | None:
    if recipe is None:
        return None
    from te_assembly.analysis.recipe_shapes import recipe_shape_diagnostics
    from te_assembly.engines.te.recipe import check_recipe_on_current_device, to_te_recipe

    te_recipe = to_te_recipe(recipe)
    if te_recipe is not None:
        # Before the GPU check: a model the recipe cannot run is a config error on any machine.
        shape_errors = [d for d in recipe_shape_diagnostics(plan.steps, recipe) if d.is_error]
        if shape_errors:
            raise ConfigError(shape_errors, summary=f"{plan.name} does not fit the quantization recipe")
        check_recipe_on_current_device(recipe)
    return te_recipe


@functools.cache
def _class(path: str) -> Any:
    # One import lookup per class for the whole build (a 10k-op model names a handful of classes).
    return load_object(path)


@functools.cache
def _placement_args(cls: Any) -> tuple[bool, bool]:
    # One signature inspection per class, not per step: on 10k-op models inspect.signature was a third
    # of the build.
    params = inspect.signature(cls).parameters
    return "device" in params, "dtype" in params


def _with_placement(
    cls: Any, kwargs: dict[str, Any], device: torch.device, dtype: torch.dtype
) -> dict[str, Any]:
    # TE's pure ops (ConstantScale, MakeExtraOutput...) and torch's activations take no device/dtype.
    takes_device, takes_dtype = _placement_args(cls)
    out = dict(kwargs)
    if takes_device:
        out["device"] = device
    if takes_dtype:
        out["dtype"] = dtype
    return out


def _construct(step: PlannedStep, kernels: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    if step.kind == "module":
        module = MODULE_ALLOWLIST[step.type]
        # TE's own module (attention) with TE's kernels; the reference module with kernels=reference.
        path = module.te_path(step.args, kernels) or module.torch_class
        cls = _class(path)
        return cls(**_with_placement(cls, step.args, device, dtype))
    spec = OPS[step.type]
    if kernels == "reference" or spec.te_class is None:
        return reference_op(step.type, step.args, device, dtype)
    cls = _class(spec.te_class)
    args = {k: v for k, v in step.args.items() if k not in spec.validation_only_params}
    try:
        op = cls(**_with_placement(cls, args, device, dtype))
    except (ValueError, TypeError, RuntimeError, AssertionError) as exc:
        raise EngineUnavailableError(
            f"TE could not construct step {step.name!r} ({spec.te_class}): {exc}"
        ) from exc
    _check_slots(step, op)
    return op


def _check_slots(step: PlannedStep, op: FusibleOperation) -> None:
    """The catalog's slot counts are TE's, or every binding index would be off."""
    basic = list(op.basic_ops) if op.is_fused_op else [op]
    found = (sum(b.num_extra_inputs for b in basic), sum(b.num_extra_outputs for b in basic))
    declared = (len(step.input_slots), len(step.output_slots))
    if found != declared or (op.is_fused_op and any(declared)):
        raise EngineUnavailableError(
            f"step {step.name!r}: TE's {type(op).__name__} has {found[0]} extra input(s) and {found[1]} "
            f"extra output(s), the catalog declares {declared[0]} and {declared[1]}; "
            "is this TE version supported?"
        )


def _fuse(plan: Plan, model: TEModel) -> list[OperationFuser | str]:
    fusers = {}
    for group, io in zip(plan.fusers, model.routing, strict=True):
        ops = [model.step_module(plan.steps_by_index[i].name) for i in group.steps]
        fuser = OperationFuser(ops)
        expected = len(io.inputs)  # the caller's public inputs, and the channels rerouted into it
        if fuser.num_extra_inputs != expected:
            raise EngineUnavailableError(
                f"fuser {group.index}: TE counts {fuser.num_extra_inputs} public extra input(s), the plan "
                f"{expected}; is this TE version supported?"
            )
        fusers[group.index] = fuser
    groups: list[OperationFuser | str] = []
    for step in plan.steps:
        if step.kind == "module":
            groups.append(step.name)
        elif step.fuser is not None and fusers.get(step.fuser) is not None:
            groups.append(fusers.pop(step.fuser))
    return groups
