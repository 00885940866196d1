"""Config-level validation: every finding at once, before any tensor or TE import.

Pure Python: this package imports neither torch nor transformer_engine.
"""

from __future__ import annotations

import gc
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from te_assembly.diagnostics import Diagnostic, dedupe, error, has_errors, sort_diagnostics
from te_assembly.errors import ConfigError
from te_assembly.plan import FuserGroup, Plan, PlannedStep
from te_assembly.schema import ModelConfig, check_structure
from te_assembly.validate.channels import RawChannels, assign_fusers, check_channels
from te_assembly.validate.steps import check_step
from te_assembly.validate.widths import check_widths


@dataclass
class Analysis:
    """Everything validation found out, including the partial steps of an invalid config (for
    ``graph``, which draws what it can and marks the rest)."""

    diagnostics: list[Diagnostic]
    plan: Plan | None
    steps: list[PlannedStep | None]
    """One entry per ``model.ops`` item; None where the step is too broken to plan."""
    fusers: list[FuserGroup]


def analyze(model: Mapping[str, Any]) -> tuple[list[Diagnostic], Plan | None]:
    """Validate a resolved model mapping (the ``model`` node); return diagnostics and, if none is an
    error, the plan."""
    result = analyze_full(model)
    return result.diagnostics, result.plan


def analyze_full(model: Mapping[str, Any]) -> Analysis:
    # Validation allocates many small acyclic objects; the cyclic collector's full passes over them
    # made 100k-op configs grow faster than linearly, and freed nothing.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _analyze(model)
    finally:
        if enabled:
            gc.enable()


def _analyze(model: Mapping[str, Any]) -> Analysis:
    diags = check_structure(ModelConfig, dict(model), "model")
    raw_ops = model.get("ops")
    ops = raw_ops if isinstance(raw_ops, list) else []
    seen: dict[str, int] = {}
    steps: list[PlannedStep | None] = []
    for index, raw in enumerate(ops):
        step, step_diags = check_step(index, raw, seen)
        steps.append(step)
        diags.extend(step_diags)
    if isinstance(raw_ops, list) and not raw_ops:
        diags.append(error("model.ops", "empty-model", "a model needs at least one step"))
    fusers = assign_fusers(steps)
    diags.extend(check_widths(steps, model.get("in_features")))  # channels compare the widths it sets
    graph = check_channels(steps, fusers, RawChannels.of(ops))
    diags.extend(graph.diagnostics)
    diags = dedupe(sort_diagnostics(diags))
    if has_errors(diags):
        return Analysis(diags, None, steps, fusers)
    planned = [s for s in steps if s is not None]
    last_width = planned[-1].out_width if planned else None
    plan = Plan(
        name=str(model["name"]),
        in_features=int(model["in_features"]),
        out_features=int(last_width if last_width is not None else model["in_features"]),
        steps=planned,
        fusers=graph.fusers,
        channels=graph.channels,
        public_inputs=graph.public_inputs,
        public_outputs=graph.public_outputs,
        dims=dict(model.get("dims") or {}),
        warnings=diags,
    )
    return Analysis(diags, plan, steps, fusers)


def analyze_mapping(model: Mapping[str, Any]) -> tuple[list[Diagnostic], Plan | None]:
    """``analyze`` for a model mapping straight from Python (``yaml.safe_load`` of a model file, a
    hand-written dict): its ``${model.dims.X}`` interpolations are resolved first, as a loaded file's are."""
    from te_assembly.config import resolve_model

    resolved, load_diags = resolve_model(model)
    diags, plan = analyze(resolved)
    if not load_diags:
        return diags, plan
    diags = dedupe(sort_diagnostics([*load_diags, *diags]))
    return diags, (None if has_errors(diags) else plan)


def validate_model(model: Mapping[str, Any]) -> list[Diagnostic]:
    """Every diagnostic for a model mapping (the ``model`` node, interpolations resolved or not)."""
    return analyze_mapping(model)[0]


def plan_or_raise(model: Mapping[str, Any]) -> Plan:
    """The plan of a model mapping, or ``ConfigError`` carrying every diagnostic."""
    diags, plan = analyze_mapping(model)
    if plan is None:
        raise ConfigError(diags)
    return plan
