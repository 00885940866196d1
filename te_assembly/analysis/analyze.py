"""Pass 3 of the config pipeline: everything the config means, checked at once, and the plan.

``analyze_resolved`` takes the resolved config (``config/resolved.py``) and runs, in this order and each
on the previous one's output, the model passes (``steps`` -> ``fusers`` -> ``widths`` -> ``channels``),
the recipe's fields, the settings sections (one field checker for all), then the checks of the model
against other sections: the recipe-aware shape rules and the parallel layout.
Every diagnostic, from loading onwards, is located (file:line), sorted and deduplicated here, once; the
``Analysis`` is frozen and is what every command, ``build()``, ``graph`` and ``explain`` read.

Pure Python: no torch, no TE.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from te_assembly.analysis.adapters import SECTION as LORA
from te_assembly.analysis.adapters import LoraSettings, attach
from te_assembly.analysis.channels import ChannelGraph, RawChannels, check_channels
from te_assembly.analysis.cross_checks import (
    COMMON,
    PARALLEL,
    checkpoint_checks,
    cross_checks,
    dtype_range_checks,
    engine_option_checks,
    fusion_warnings,
    sequence_checks,
)
from te_assembly.analysis.fusers import assign_fusers
from te_assembly.analysis.head import head_start
from te_assembly.analysis.layouts import check_layouts
from te_assembly.analysis.model_size import check_model_size
from te_assembly.analysis.origins import present
from te_assembly.analysis.parallel.layout import ShardPlan
from te_assembly.analysis.parallel.settings import (
    ParallelSettings,
)
from te_assembly.analysis.plan import BlockGroup, FuserGroup, Plan, PlannedStep
from te_assembly.analysis.recipes import Recipe, validate_recipe
from te_assembly.analysis.settings import COMMON_KEYS, CommonSettings, RunSettings
from te_assembly.analysis.steps import check_step, scope_clashes
from te_assembly.analysis.ties import check_ties
from te_assembly.analysis.widths import check_widths
from te_assembly.collector import paused
from te_assembly.config.resolved import ResolvedConfig
from te_assembly.config.schema import ModelConfig, check_structure
from te_assembly.diagnostics import Diagnostic, dedupe, error, has_errors, sort_diagnostics
from te_assembly.errors import ConfigError
from te_assembly.sections import read_section, section_diagnostics

COMMON_SECTIONS: dict[str, type] = {COMMON: CommonSettings, PARALLEL: ParallelSettings, LORA: LoraSettings}
"""What every command checks: the top-level keys and the parallel layout (the model must split as it
says, whatever the command)."""
DEFAULT_SECTIONS: dict[str, type] = {**COMMON_SECTIONS, "run": RunSettings}
"""What ``validate``, ``run`` and ``build()`` check; other commands check the top-level keys and their
own section (``train``, ``bench``, ``graph``)."""


@dataclass(frozen=True)
class ModelAnalysis:
    """The model passes' output, also for a model with errors (``graph`` draws what it can)."""

    steps: tuple[PlannedStep | None, ...] = ()
    """One entry per ``model.ops`` item; None where the step is too broken to plan."""
    fusers: tuple[FuserGroup, ...] = ()
    graph: ChannelGraph | None = None
    diagnostics: tuple[Diagnostic, ...] = ()
    input_layout: str = "any"
    """What ``x`` must look like (``layouts.py``)."""
    input_layout_source: str = ""
    head: int | None = None
    """Where a language model's head begins (``head.py``)."""


@dataclass(frozen=True)
class Analysis:
    """Everything known about one config. ``plan`` is None when any diagnostic is an error."""

    resolved: ResolvedConfig
    model: ModelAnalysis
    recipe: Recipe | None
    """The validated recipe; None for none chosen (no quantization) or an invalid one."""
    sections: Mapping[str, Any]
    """Section name -> its settings dataclass, for each checked section that is valid."""
    diagnostics: tuple[Diagnostic, ...]
    plan: Plan | None = None
    layout: ShardPlan | None = None
    """Which rank holds which slice under the ``parallel`` sizes (one process: every step whole); None
    when the section was not checked, or the model or layout has errors."""
    step_diagnostics: tuple[Diagnostic, ...] = ()
    """The model's diagnostics as the passes found them, at the expanded model's key paths
    (``model.ops[K]``, one step per use of a block): what ``graph`` marks on each step."""
    warnings: tuple[Diagnostic, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "warnings", tuple(d for d in self.diagnostics if not d.is_error))

    @property
    def steps(self) -> tuple[PlannedStep | None, ...]:
        return self.model.steps

    @property
    def fusers(self) -> tuple[FuserGroup, ...]:
        return self.model.fusers

    @property
    def graph(self) -> ChannelGraph | None:
        return self.model.graph

    @property
    def blocks(self) -> tuple[BlockGroup, ...]:
        """The model's block steps and their uses (also for a model with errors)."""
        expansion = self.resolved.expansion
        return expansion.groups if expansion is not None else ()

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.is_error]

    def checked_plan(self) -> Plan:
        """The plan, or ``ConfigError`` carrying every diagnostic."""
        if self.plan is None:
            raise ConfigError(list(self.diagnostics))
        return self.plan

    def section(self, name: str) -> Any:
        """The settings dataclass of a checked section (``run``, ``train``...; ``""`` for the top-level
        keys); ``ConfigError`` when the section has errors or was not checked."""
        if name not in self.sections:
            raise ConfigError([d for d in self.diagnostics if d.path.startswith(name)] or self.errors)
        return self.sections[name]


def analyze_model(model: Mapping[str, Any], block_steps: Collection[int] = ()) -> ModelAnalysis:
    """The model passes on a resolved model mapping (the ``model`` node); ``block_steps``: the indices
    of the steps that block uses expanded into."""
    with paused():  # see collector.py
        return _model_passes(model, block_steps)


def _model_passes(model: Mapping[str, Any], block_steps: Collection[int]) -> ModelAnalysis:
    diags = check_structure(ModelConfig, dict(model), "model")
    raw_ops = model.get("ops")
    ops = raw_ops if isinstance(raw_ops, list) else []
    seen: dict[str, int] = {}
    drafts: list[PlannedStep | None] = []
    for index, raw in enumerate(ops):
        step, step_diags = check_step(index, raw, seen)
        drafts.append(step)
        diags.extend(step_diags)
    if isinstance(raw_ops, list) and not raw_ops:
        diags.append(error("model.ops", "empty-model", "a model needs at least one step"))
    if any("." in name for name in seen):
        diags.extend(scope_clashes(seen))
    head = head_start(drafts, block_steps)
    fused, fusers = assign_fusers(drafts, head)
    steps, width_diags = check_widths(fused, model.get("in_features"))
    diags.extend(width_diags)
    diags.extend(check_ties(steps))
    graph = check_channels(steps, fusers, RawChannels.of(ops))
    diags.extend(graph.diagnostics)
    layouts = check_layouts(steps, model.get("input_layout"), graph)
    diags.extend(layouts.diagnostics)
    diags.extend(check_model_size(layouts.steps))
    return ModelAnalysis(
        tuple(layouts.steps), tuple(fusers), graph, tuple(diags), layouts.input_layout, layouts.source, head
    )


def _plan(
    model: Mapping[str, Any],
    result: ModelAnalysis,
    warnings: list[Diagnostic],
    blocks: tuple[BlockGroup, ...],
) -> Plan:
    planned = [s for s in result.steps if s is not None]
    assert result.graph is not None
    last_width = planned[-1].out_width if planned else None
    return Plan(
        name=str(model["name"]),
        in_features=int(model["in_features"]),
        out_features=int(last_width if last_width is not None else model["in_features"]),
        steps=planned,
        fusers=result.graph.fusers,
        channels=result.graph.channels,
        public_inputs=result.graph.public_inputs,
        public_outputs=result.graph.public_outputs,
        dims=dict(model.get("dims") or {}),
        warnings=warnings,
        input_layout=result.input_layout,
        input_layout_source=result.input_layout_source,
        reroutes=result.graph.reroutes,
        blocks=blocks,
        head=result.head,
    )


def _settings(
    resolved: ResolvedConfig, sections: Mapping[str, type]
) -> tuple[dict[str, Any], list[Diagnostic]]:
    parsed: dict[str, Any] = {}
    diags: list[Diagnostic] = []
    for name, cls in sections.items():
        if name == COMMON:
            raw: Any = {k: resolved.settings[k] for k in COMMON_KEYS if k in resolved.settings}
        else:
            raw = resolved.settings.get(name)
        found = section_diagnostics(cls, raw, name)
        diags.extend(found)
        if not found:
            parsed[name] = read_section(cls, raw or {}, name)
    return parsed, diags


def analyze_resolved(resolved: ResolvedConfig, sections: Mapping[str, type] | None = None) -> Analysis:
    """Pass 3 (see the module docstring). ``sections``: settings sections to check and parse, by name
    (default: the top-level keys and ``run``)."""
    diags: list[Diagnostic] = list(resolved.diagnostics)
    attached = attach(resolved.expanded_model, resolved.expansion, resolved.settings.get(LORA))
    diags.extend(attached.diagnostics)
    if attached.expansion is not resolved.expansion:  # adapters joined the model (``adapters.py``)
        resolved = dataclasses.replace(resolved, expansion=attached.expansion)
    model = attached.model
    expansion = resolved.expansion
    blocks = expansion.groups if expansion is not None else ()
    result = ModelAnalysis()
    step_diags: list[Diagnostic] = []
    if model is not None:
        result = analyze_model(model, {i for group in blocks for use in group.uses for i in use.steps})
        step_diags.extend(result.diagnostics)
    elif not any(d.path == "model" or d.path.startswith("model.") for d in diags):
        message = "no model is chosen: pick one with model=NAME or model=path/to/model.yaml"
        diags.append(error("model", "no-model", message))
    recipe = None
    if resolved.recipe is not None:
        recipe_diags = validate_recipe(resolved.recipe, prefix="recipe")
        diags.extend(recipe_diags)
        if not has_errors(recipe_diags):
            recipe = Recipe(resolved.recipe)
    parsed, settings_diags = _settings(resolved, DEFAULT_SECTIONS if sections is None else sections)
    diags.extend(settings_diags)
    # The model as a plan as soon as the model itself is sound: checks across sections read it.
    sound = model is not None and result.graph is not None and not has_errors(result.diagnostics)
    sound = sound and not has_errors(d for d in resolved.diagnostics if d.path.startswith(("model", "block")))
    candidate = _plan(model, result, [], blocks) if sound and model is not None else None
    cross, layout = cross_checks(candidate, recipe, parsed.get(PARALLEL))
    step_diags.extend(cross)
    step_diags.extend(fusion_warnings(candidate, recipe, parsed))
    # Each finding of the expanded model at its source: the model file, or a block's file and use.
    diags.extend(present(step_diags, expansion))
    diags.extend(sequence_checks(candidate, parsed))
    diags.extend(dtype_range_checks(parsed))
    diags.extend(engine_option_checks(parsed, recipe))
    diags.extend(checkpoint_checks(parsed))
    final = _finish(diags, resolved)
    steps_found = tuple(step_diags)
    if candidate is None or has_errors(final):
        return Analysis(resolved, result, recipe, parsed, tuple(final), step_diagnostics=steps_found)
    plan = dataclasses.replace(candidate, warnings=[d for d in final if not d.is_error])
    return Analysis(resolved, result, recipe, parsed, tuple(final), plan, layout, steps_found)


def _finish(diags: Sequence[Diagnostic], resolved: ResolvedConfig) -> list[Diagnostic]:
    """Every diagnostic located in its file (model, recipe, then the settings' config file), sorted
    file by file in source order, and deduplicated."""
    order = [resolved.sources[k] for k in ("model",) if k in resolved.sources]
    order.extend(resolved.expansion.sources if resolved.expansion is not None else ())
    order.extend(resolved.sources[k] for k in ("recipe", "config", "shipped config") if k in resolved.sources)
    set_by = command_line_keys(resolved.overrides)
    located = []
    blocks = resolved.expansion.blocks if resolved.expansion is not None else {}
    for d in diags:
        override = _override_for(d.path, set_by) if d.file is None else None
        if override is None and d.override is None and blocks:
            override = _block_override_for(d.path, blocks, set_by)
        if override is not None:
            # The file's line holds the default; what is wrong is the value the command line gave.
            d = dataclasses.replace(d, override=override)
        for source in order:
            d = source.locate(d)
            if d.file is not None:
                break
        located.append(d)
    return dedupe(sort_diagnostics(located, [s.file for s in order]))


def command_line_keys(overrides: Sequence[str]) -> dict[str, str]:
    """Key path -> the override that set it (the last one wins, as in Hydra); group choices (``model``,
    ``recipe``) and ``hydra.`` keys left out."""
    out: dict[str, str] = {}
    for text in overrides:
        key, sep, _ = text.partition("=")
        key = key.lstrip("+~")
        chosen_group = key in ("model", "recipe") or key.startswith("hydra.")
        if key and (sep or text.startswith("~")) and not chosen_group:
            out[key] = text
    return out


_IN_BLOCK = re.compile(r"\(block ([^)]+)\): (.+)$")
_BLOCK_DIM = re.compile(r"\$\{block\.dims\.(\w+)\}")


def _block_override_for(path: str, blocks: Mapping[str, Any], set_by: Mapping[str, str]) -> str | None:
    """For a diagnostic inside a block (``model.layers[0] (block moe_layer): ops[3].args.x``): the
    command-line ``block.<name>....`` override that gave the value, directly or through a
    ``${block.dims.X}`` the value reads."""
    found = _IN_BLOCK.search(path)
    if found is None or not set_by:
        return None
    name, local = found.group(1), found.group(2)
    dotted = re.sub(r"\[(\d+)\]", r".\1", local)
    prefix = f"block.{name}"
    candidate = dotted
    while candidate:  # the key itself or one above it
        if f"{prefix}.{candidate}" in set_by:
            return set_by[f"{prefix}.{candidate}"]
        candidate = candidate.rpartition(".")[0]
    value: Any = blocks.get(name)
    for key in dotted.split("."):
        if isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        elif isinstance(value, Mapping):
            value = value.get(key)
        else:
            return None
    for dim in _BLOCK_DIM.findall(value) if isinstance(value, str) else ():
        if f"{prefix}.dims.{dim}" in set_by:
            return set_by[f"{prefix}.dims.{dim}"]
    return None


def _override_for(path: str, set_by: Mapping[str, str]) -> str | None:
    """The override that set ``path`` or a key above it, if any. Model and recipe value overrides are
    left to the file: their errors are located where the value is used (an interpolation site)."""
    if not set_by:
        return None
    candidate = path
    while candidate:
        if candidate in set_by and not candidate.startswith(("model.", "recipe.")):
            return set_by[candidate]
        cut = max(candidate.rfind("."), candidate.rfind("["))
        candidate = candidate[:cut] if cut > 0 else ""
    return None


__all__ = [
    "COMMON",
    "COMMON_SECTIONS",
    "DEFAULT_SECTIONS",
    "PARALLEL",
    "Analysis",
    "ModelAnalysis",
    "analyze_model",
    "analyze_resolved",
    "command_line_keys",
]
