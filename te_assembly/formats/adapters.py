"""A model with LoRA adapters, as files: its base plan, the adapters merged into the base's weights,
and the adapters alone in PEFT's format (``adapter_config.json`` + ``adapter_model.safetensors``),
both ways.

PEFT names an adapter by the module it adapts (``base_model.model.model.layers.0.self_attn.q_proj``):
each part of a stacked te_assembly projection is one of them, found through the Hugging Face rules of
the base (``hf/names.py``: ``qkv`` = q_proj | k_proj | v_proj rows), so every family ``import-hf``
reads has its PEFT names without a table of its own.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from te_assembly.analysis.adapters import pattern_of
from te_assembly.analysis.plan import Plan, PlannedStep
from te_assembly.catalog import ADAPTER_TYPES
from te_assembly.catalog.adapter_ops import MAGNITUDE, adapted_parts, parts_of, scaling
from te_assembly.errors import ArgumentError
from te_assembly.files.directory import PEFT, check_destination, write_directory
from te_assembly.files.read import LIMITS, InputFileError, read_json
from te_assembly.formats.checkpoint import CheckpointError
from te_assembly.formats.model_record import model_record
from te_assembly.formats.tensor_file import open_safetensors, save_tensors

PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."


def adapter_steps(plan: Plan) -> list[PlannedStep]:
    return [s for s in plan.steps if s.type in ADAPTER_TYPES]


def adapted_step(plan: Plan, adapter: PlannedStep) -> PlannedStep:
    """The projection an adapter step adapts: the step just before it."""
    return plan.steps[adapter.index - 1]


def base_plan(plan: Plan) -> Plan:
    """``plan`` without its adapters: each adapter step and the ``MakeExtraOutput`` that keeps its input
    only for it are gone; every other step keeps its name (and so its weights' names)."""
    from te_assembly.analysis.pipeline import load

    adapters = adapter_steps(plan)
    if not adapters:
        return plan
    kept_for = {s.input_channels[0] for s in adapters}
    record = model_record(plan)
    ops = [
        op
        for op, step in zip(record["ops"], plan.steps, strict=True)
        if step.type not in ADAPTER_TYPES
        and not (
            step.type == "MakeExtraOutput" and step.output_channels and step.output_channels[0] in kept_for
        )
    ]
    return load({**record, "ops": ops}).checked_plan()


def _delta(adapter: PlannedStep, weights: Mapping[str, torch.Tensor], suffix: str) -> torch.Tensor:
    """``scaling * B @ A`` of one adapter set, parts stacked by rows (zeros for a part without one)."""
    args = adapter.args
    rows = []
    for i, width in enumerate(parts_of(args)):
        if i in adapted_parts(args):
            a = weights[f"steps.{adapter.name}.lora_A{i}{suffix}"].double()
            b = weights[f"steps.{adapter.name}.lora_B{i}{suffix}"].double()
            rows.append(b @ a)
        else:
            rows.append(torch.zeros(width, int(args["in_features"]), dtype=torch.float64))
    return torch.cat(rows, dim=0) * scaling(args)


def _rescaled(
    adapter: PlannedStep, weights: Mapping[str, torch.Tensor], merged: torch.Tensor
) -> torch.Tensor:
    """DoRA folded in: each adapted part's rows of ``W + scaling * B A`` rescaled to their magnitudes
    (PEFT's merge: ``magnitude / ||W + scaling * B A||`` per row)."""
    start = 0
    rows = []
    for i, width in enumerate(parts_of(adapter.args)):
        part = merged[start : start + width]
        if i in adapted_parts(adapter.args):
            magnitude = weights[f"steps.{adapter.name}.{MAGNITUDE}{i}"].double()
            part = part * (magnitude / torch.linalg.norm(part, dim=1))[:, None]
        rows.append(part)
        start += width
    return torch.cat(rows, dim=0)


def merged_weights(plan: Plan, weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The base's weights with every adapter folded in (``W + scaling * B @ A``, summed in float64 and
    rounded once to the weight's dtype): the weights of ``base_plan(plan)``, computing what the model
    with adapters computes."""
    out = {k: v for k, v in weights.items() if k not in plan.adapter_params}
    for adapter in adapter_steps(plan):
        target = adapted_step(plan, adapter)
        if adapter.type == "LoRA":
            key = f"steps.{target.name}.basic_ops.0.weight"
            if key in plan.tied_params:
                raise ArgumentError(
                    f"step {target.name!r} has an adapter and its weight is tied to "
                    f"{plan.tied_params[key]!r}: folding the adapter into the shared weight would change "
                    "that one too, so no merged model computes what this one does; export it without "
                    "merging (format te keeps the adapters), or train without an adapter on "
                    f"{target.name!r}"
                )
            merged = out[key].double() + _delta(adapter, weights, "")
            if adapter.args.get("dora"):
                merged = _rescaled(adapter, weights, merged)
            out[key] = merged.to(out[key].dtype)
        else:
            for g in range(int(adapter.args["num_groups"])):
                key = f"steps.{target.name}.weight{g}"
                out[key] = (out[key].double() + _delta(adapter, weights, f"_{g}")).to(out[key].dtype)
    return out


def merged_model(model: torch.nn.Module) -> Any:
    """A reference-engine model of ``model``'s base with its adapters merged (its dtype, eval mode)."""
    from te_assembly.engines.target import Target

    plan: Plan = model.plan  # type: ignore[assignment]
    state = {k: v.detach().to("cpu") for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    dtype = next(iter(state.values())).dtype
    merged = Target(engine="reference", dtype=dtype).build(base_plan(plan))
    merged.load_state_dict(merged_weights(plan, state))
    return merged.eval()


# --- PEFT ------------------------------------------------------------------------------------------


def _modules(plan: Plan) -> dict[tuple[str, int], str]:
    """(adapter step, part) -> the Hugging Face module PEFT adapts there (``model.layers.0.mlp.up_proj``).
    ``ArgumentError`` for an adapter PEFT's format cannot hold (beside experts: one stacked tensor)."""
    from te_assembly.formats.hf.mapping import rules_of_plan

    base = base_plan(plan)
    table = {rule.te: rule for rule in rules_of_plan(base)}
    out: dict[tuple[str, int], str] = {}
    for adapter in adapter_steps(plan):
        target = adapted_step(plan, adapter)
        if adapter.type != "LoRA":
            raise ArgumentError(
                f"step {adapter.name!r} adapts the experts of {target.name!r}: PEFT stores expert adapters "
                "of a stacked expert tensor in a form te_assembly does not write; export the run in the te "
                "format, or merge it (export.merge=true)"
            )
        rule = table.get(f"steps.{target.name}.basic_ops.0.weight")
        parts = parts_of(adapter.args)
        if rule is None or len(rule.hub) != len(parts) or any(p.index is not None for p in rule.hub):
            raise ArgumentError(f"step {target.name!r} has no Hugging Face module PEFT could name")
        for i in adapted_parts(adapter.args):
            out[(adapter.name, i)] = rule.hub[i].name.removesuffix(".weight")
    return out


def _peft_names(adapter: PlannedStep, i: int, module: str) -> dict[str, str]:
    """Part ``i`` of ``adapter``'s parameters -> PEFT's names of them (``module``'s)."""
    names = {f"lora_{kind}{i}": f"{PEFT_PREFIX}{module}.lora_{kind}.weight" for kind in ("A", "B")}
    if adapter.args.get("dora"):
        names[f"{MAGNITUDE}{i}"] = f"{PEFT_PREFIX}{module}.lora_magnitude_vector"
    return names


def peft_tensors(plan: Plan, weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapters of ``weights`` under PEFT's names."""
    out = {}
    steps = {s.name: s for s in adapter_steps(plan)}
    for (step, i), module in _modules(plan).items():
        for ours, theirs in _peft_names(steps[step], i, module).items():
            out[theirs] = weights[f"steps.{step}.{ours}"].contiguous()
    return out


def peft_config(plan: Plan, base_name: str | None) -> dict[str, Any]:
    """``adapter_config.json`` for the plan's adapters (one rank, alpha, dropout and scaling rule for
    all of them, as the ``lora:`` section makes them)."""
    adapters = adapter_steps(plan)
    args = adapters[0].args
    for step in adapters[1:]:
        if any(step.args.get(k) != args.get(k) for k in ("rank", "alpha", "dropout", "rslora", "dora")):
            raise ArgumentError(
                f"steps {adapters[0].name!r} and {step.name!r} have different LoRA settings: PEFT's "
                "adapter_config.json holds one rank and alpha for every module"
            )
    modules = sorted({m.rsplit(".", 1)[-1] for m in _modules(plan).values()})
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_name,
        "r": int(args["rank"]),
        "lora_alpha": float(args["alpha"]),
        "lora_dropout": float(args["dropout"]),
        "use_rslora": bool(args.get("rslora")),
        "use_dora": bool(args.get("dora")),
        "target_modules": modules,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "modules_to_save": None,
    }


def write_peft(
    plan: Plan,
    weights: Mapping[str, torch.Tensor],
    dest: str | os.PathLike[str],
    *,
    base_name: str | None = None,
    overwrite: bool = False,
    sources: tuple[str | os.PathLike[str], ...] = (),
) -> Path:
    """The adapters of ``plan`` as a PEFT adapter directory (``PeftModel.from_pretrained(base, dest)``
    loads it), through the guarded directory writer."""

    if not plan.adapter_params:
        raise ArgumentError(f"{plan.name} has no adapters to export in PEFT's format (lora.rank is null)")
    check_destination(dest, PEFT, overwrite=overwrite, sources=sources)
    tensors = {k: v.detach().to("cpu") for k, v in peft_tensors(plan, weights).items()}
    config = peft_config(plan, base_name)

    def fill(staging: Path) -> None:
        save_tensors(tensors, staging / PEFT_WEIGHTS, metadata={"format": "pt"})
        (staging / PEFT_CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")

    return write_directory(dest, PEFT, fill, overwrite=overwrite, sources=sources)


PEFT_REFUSED = {
    "layers_to_transform": "it adapts some layers only",
    "layers_pattern": "it adapts some layers only",
    "layer_replication": "it repeats layers of the base",
    "alora_invocation_tokens": "activated LoRA applies the adapters only after its invocation tokens",
    "rank_pattern": "it gives some modules another rank",
    "alpha_pattern": "it gives some modules another alpha",
    "modules_to_save": "whole modules are trained and saved beside the adapters",
    "exclude_modules": "it leaves some of the targeted modules out",
    "target_parameters": "it adapts parameters, not modules",
    "trainable_token_indices": "it trains some embedding rows",
    "lora_bias": "it adds a bias to each B",
    "use_qalora": "QALoRA pools the input by groups",
    "fan_in_fan_out": "its weights are stored transposed (Conv1D bases)",
}
"""PEFT's fields that change what the adapters compute in ways te_assembly does not: refused by name
whenever set (not null, false or empty)."""

PEFT_METADATA = frozenset(
    {
        "peft_type",
        "task_type",
        "base_model_name_or_path",
        "revision",
        "inference_mode",
        "init_lora_weights",
        "auto_mapping",
        "peft_version",
        "loftq_config",
        "eva_config",
        "corda_config",
        "runtime_config",
        "megatron_config",
        "megatron_core",
        "qalora_group_size",
        "ensure_weight_tying",
    }
)
"""PEFT's fields that say where an adapter came from or how it was initialised: nothing te_assembly
computes depends on them."""

PEFT_READ = ("r", "lora_alpha", "lora_dropout", "use_rslora", "use_dora", "target_modules", "bias")


def _is_set(value: Any) -> bool:
    return not (value is None or value is False or value == {} or value == [] or value == "")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def checked_peft_config(config: Any, path: Path) -> dict[str, Any]:
    """``adapter_config.json`` checked field by field: what te_assembly reads, with its types and ranges
    (PEFT's defaults where a field is absent), every other field metadata or refused by name; one
    ``CheckpointError`` naming every problem."""
    if not isinstance(config, Mapping):
        raise CheckpointError(f"{path}: not a JSON object")
    problems = []
    if config.get("peft_type") != "LORA":
        problems.append(
            f"peft_type = {_shown(config.get('peft_type'))}: te_assembly reads LoRA adapters (LORA) only"
        )
    out = {
        "r": config.get("r", 8),
        "lora_alpha": config.get("lora_alpha", 8),
        "bias": config.get("bias", "none"),
    }
    out.update(lora_dropout=config.get("lora_dropout", 0.0), use_rslora=config.get("use_rslora", False))
    out["use_dora"] = config.get("use_dora", False)
    out["target_modules"] = config.get("target_modules")
    if not isinstance(out["r"], int) or isinstance(out["r"], bool) or out["r"] < 1:
        problems.append(f"r = {_shown(out['r'])}: expected a positive integer")
    if not _number(out["lora_alpha"]) or out["lora_alpha"] <= 0:
        problems.append(f"lora_alpha = {_shown(out['lora_alpha'])}: expected a positive number")
    if not _number(out["lora_dropout"]) or not 0 <= out["lora_dropout"] < 1:
        problems.append(f"lora_dropout = {_shown(out['lora_dropout'])}: expected a number from 0 to below 1")
    for flag in ("use_rslora", "use_dora"):
        if not isinstance(out[flag], bool):
            problems.append(f"{flag} = {_shown(out[flag])}: expected true or false")
    if out["bias"] != "none":
        problems.append(f"bias = {_shown(out['bias'])}: te_assembly's adapters train no bias (none only)")
    modules = out["target_modules"]
    if isinstance(modules, str):
        problems.append(
            f"target_modules = {_shown(modules)}: a pattern; te_assembly reads a list of module names "
            "(PEFT writes one once the adapter is made)"
        )
    elif not isinstance(modules, list) or not modules or not all(isinstance(m, str) and m for m in modules):
        problems.append(f"target_modules = {_shown(modules)}: expected a non-empty list of module names")
    for key, value in config.items():
        if key in PEFT_REFUSED and _is_set(value):
            problems.append(f"{key} = {_shown(value)} is not supported: {PEFT_REFUSED[key]}")
        elif key not in PEFT_REFUSED and key not in PEFT_METADATA and key not in PEFT_READ and _is_set(value):
            problems.append(f"{key} = {_shown(value)}: a field te_assembly does not know, so cannot honour")
    if problems:
        raise CheckpointError(f"{path}: " + "; ".join(problems))
    return {**config, **out}


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def read_peft(directory: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A PEFT adapter directory's config (``checked_peft_config``) and tensors (PEFT's names; each held to
    its adapter by ``from_peft_tensors``), both read through the bounded reader inside the folder (a
    symlink out of it is refused); ``CheckpointError`` for anything but a LoRA adapter te_assembly can
    place."""
    folder = Path(directory).expanduser()
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a PEFT adapter directory (no such directory)")
    try:
        raw = read_json(folder / PEFT_CONFIG, limit=LIMITS["metadata"], within=folder)
    except InputFileError as exc:
        raise CheckpointError(f"{folder} is not a PEFT adapter directory: {exc}") from None
    config = checked_peft_config(raw, folder / PEFT_CONFIG)
    weights = folder / PEFT_WEIGHTS
    if not (weights.exists() or weights.is_symlink()):
        raise CheckpointError(f"{folder} has no {PEFT_WEIGHTS} (an adapter saved with safe_serialization)")
    with open_safetensors(weights, within=folder) as handle:
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    return config, tensors


def lora_section(config: Mapping[str, Any], plan: Plan) -> dict[str, Any]:
    """The ``lora:`` section that rebuilds a PEFT adapter's branches on ``plan`` (its base): its rank,
    alpha, dropout, scaling rule and targets, each PEFT module as a step and part."""
    from te_assembly.formats.hf.mapping import rules_of_plan

    config = checked_peft_config(config, Path(PEFT_CONFIG))
    modules, rank = config["target_modules"], config["r"]
    wanted = {str(m) for m in modules}
    targets: dict[str, set[str]] = {}
    found = set()
    for rule in rules_of_plan(plan):
        if not rule.te.endswith(".basic_ops.0.weight"):
            continue
        step = rule.te.removeprefix("steps.").removesuffix(".basic_ops.0.weight")
        for part in rule.hub:
            module = part.name.removesuffix(".weight").rsplit(".", 1)[-1]
            if module in wanted:
                found.add(module)
                chosen = targets.setdefault(pattern_of(step), set())
                if len(rule.hub) > 1:
                    chosen.add(_PART_NAMES.get(module, module))
    missing = sorted(wanted - found)
    if missing:
        raise CheckpointError(f"{PEFT_CONFIG}: target_modules {missing} name no projection of {plan.name}")
    return {
        "rank": rank,
        "alpha": float(config["lora_alpha"]),
        "dropout": float(config["lora_dropout"]),
        "rslora": config["use_rslora"],
        "dora": config["use_dora"],
        "targets": [f"{p}:{'+'.join(sorted(parts))}" if parts else p for p, parts in sorted(targets.items())],
    }


_PART_NAMES = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "gate_proj": "gate", "up_proj": "up"}
"""PEFT's module names of a stacked projection's parts, as the ``lora:`` section names the parts."""


def adapter_plan(base: Plan, lora: Mapping[str, Any]) -> Plan:
    """``base`` with the adapters the ``lora:`` section ``lora`` describes."""
    from te_assembly.analysis.pipeline import load

    return load({"model": model_record(base), "lora": dict(lora)}).checked_plan()


def peft_adapter_plan(
    base: Plan, config: Mapping[str, Any], directory: str | os.PathLike[str]
) -> tuple[Plan, dict[str, Any]]:
    """``base`` with the adapters of a PEFT adapter's (checked) ``config``, and the ``lora:`` section that
    builds them; what does not fit the base (a rank wider than a projection) is a ``CheckpointError``
    naming ``adapter_config.json``, not a setting."""
    from te_assembly.errors import ConfigError

    lora = lora_section(config, base)
    try:
        return adapter_plan(base, lora), lora
    except ConfigError as exc:
        found = "; ".join(d.message for d in exc.diagnostics if d.is_error)
        raise CheckpointError(
            f"{Path(directory).expanduser() / PEFT_CONFIG}: the adapter (r = {config['r']}, target_modules "
            f"{_shown(config['target_modules'])}) does not fit {base.name}: {found}"
        ) from None


def with_adapter(model: Any, directory: str | os.PathLike[str]) -> Any:
    """``model`` (a base built by te_assembly: ``from_hf``, ``from_pretrained``) with the PEFT adapter
    in ``directory`` on it, built on the reference engine in the model's dtype, in eval mode."""
    from te_assembly.engines.target import Target

    config, tensors = read_peft(directory)
    plan, _ = peft_adapter_plan(model.plan, config, directory)
    state = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    dtype = next(iter(state.values())).dtype
    out = Target(engine="reference", dtype=dtype).build(plan)
    adapters = {k: v.to(dtype) for k, v in from_peft_tensors(plan, tensors).items()}
    out.load_state_dict({**state, **adapters})
    return out.eval()


def from_peft_tensors(plan: Plan, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """PEFT-named ``tensors`` under the names of ``plan``'s adapters (a plan whose adapters the adapter's
    config built), each a finite float of the shape its adapter needs; ``CheckpointError`` naming what is
    missing, left over, not finite or of another rank or base."""
    out: dict[str, torch.Tensor] = {}
    steps = {s.name: s for s in adapter_steps(plan)}
    used = set()
    for (step, i), module in _modules(plan).items():
        for ours, key in _peft_names(steps[step], i, module).items():
            if key not in tensors:
                raise CheckpointError(f"{PEFT_WEIGHTS} has no {key}")
            tensor, needed = tensors[key], tuple(steps[step].param_shapes[ours])
            if not tensor.is_floating_point():
                raise CheckpointError(
                    f"{PEFT_WEIGHTS}: {key} is {tensor.dtype}, not a float: it is no weight"
                )
            if tuple(tensor.shape) != needed:
                raise CheckpointError(
                    f"{PEFT_WEIGHTS}: {key} has shape {tuple(tensor.shape)}; the base and "
                    f"adapter_config.json (r = {steps[step].args['rank']}) need {needed}: the adapter was "
                    "made with another rank or for another base"
                )
            if not torch.isfinite(tensor).all():
                raise CheckpointError(f"{PEFT_WEIGHTS}: {key} holds NaN or inf")
            out[f"steps.{step}.{ours}"] = tensor
            used.add(key)
    extra = sorted(set(tensors) - used)
    if extra:
        raise CheckpointError(f"{PEFT_WEIGHTS} holds tensors no adapter of {plan.name} takes: {extra[:4]}")
    return out
