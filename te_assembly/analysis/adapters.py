"""The ``lora:`` section: LoRA adapters put into the model as steps, before any pass checks it.

For every linear step a target names, two steps join the expanded model (``config/blocks.py``): a
``MakeExtraOutput`` before the projection keeps its input on a channel, and a ``LoRA`` (``GroupedLoRA``
beside a ``GroupedLinear``: one adapter per expert) after it adds the low-rank update. The projection
stays what it was (one TE fused op in its fuser); the branch is ordinary steps and channels, so the
passes, ``explain``, ``graph``, both engines and every checkpoint see it as they see any other step.
A stacked projection gets one adapter per part, as PEFT adapts ``q_proj``, ``k_proj`` and ``v_proj``
apart: the parts are read from the step the projection feeds (an ``Attention``: q | k | v; a gated
activation: gate | up). ``targets: [layers.*.qkv:q+v]`` adapts some parts only (``q,v`` in YAML too).

Pure Python: no torch.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from te_assembly.catalog import MODULE_ALLOWLIST, OPS
from te_assembly.config.block_uses import BlockGroup, BlockUse
from te_assembly.config.blocks import Expansion, Origin
from te_assembly.diagnostics import Diagnostic, did_you_mean, error
from te_assembly.fields import FieldSpec
from te_assembly.sections import read_section, section_diagnostics, setting

SECTION = "lora"
ALL_LINEAR = "all-linear"
ADAPTED = {"Linear": "LoRA", "GroupedLinear": "GroupedLoRA"}
"""The ops LoRA adapts, and the adapter op each gets."""

TARGETS_DOC = (
    "step names or patterns (layers.*.qkv, *.fc1; layers[*].qkv reads the same), optionally with the "
    "parts of a stacked projection (layers.*.qkv:q+v; fc1's parts are gate and up); all-linear: every "
    "Linear and GroupedLinear but the output head"
)


@dataclass(frozen=True)
class LoraSettings:
    """``lora:``: low-rank adapters beside frozen linear steps (docs/guides/lora.md)."""

    rank: int | None = setting(None, minimum=1, doc="null: no adapters; r: rank-r adapters on every target")
    alpha: float = setting(
        16.0, exclusive_minimum=True, minimum=0.0, doc="the update is scaled by alpha / rank"
    )
    dropout: float = setting(
        0.0, minimum=0.0, maximum=0.99, doc="dropout on each adapter's input in training"
    )
    rslora: bool = setting(False, doc="rank-stabilised LoRA: scale by alpha / sqrt(rank)")
    dora: bool = setting(
        False,
        doc="weight-decomposed LoRA (PEFT's use_dora): each adapted weight row rescaled to a learned "
        "magnitude; not beside experts (GroupedLinear)",
    )
    targets: list[str] = setting(
        [ALL_LINEAR], items=FieldSpec(str, nonempty=True), single_as_list=True, doc=TARGETS_DOC
    )


@dataclass(frozen=True)
class Attached:
    """The model with its adapters, and where each of its steps came from."""

    model: Mapping[str, Any] | None
    expansion: Expansion | None
    diagnostics: tuple[Diagnostic, ...] = ()


def attach(model: Mapping[str, Any] | None, expansion: Expansion | None, raw: Any) -> Attached:
    """``model`` (expanded) with the adapters ``raw`` (the ``lora:`` section) asks for; every problem
    with the section as diagnostics at its key paths."""
    if raw is None or not isinstance(model, Mapping) or not isinstance(model.get("ops"), list):
        return Attached(model, expansion)
    diags = section_diagnostics(LoraSettings, raw, SECTION)
    settings = None if diags else read_section(LoraSettings, raw, SECTION)
    if settings is None or settings.rank is None:
        return Attached(model, expansion, tuple(diags))
    ops: list[Any] = list(model["ops"])
    chosen, diags = _targets(ops, settings.targets)
    inserted: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
    for index, wanted in chosen.items():
        pair = _branch(ops, index, wanted, settings, diags)
        if pair is not None:
            inserted[index] = pair
    if diags:
        return Attached(model, expansion, tuple(diags))
    new_ops: list[Any] = []
    origins: list[Origin] = []
    old_origins = expansion.origins if expansion is not None else None
    for index, step in enumerate(ops):
        origin = old_origins[index] if old_origins is not None else Origin(position=index, group=-1)
        keep, lora = inserted.get(index, (None, None))
        for one in (keep, step, lora):
            if one is not None:
                new_ops.append(one)
                origins.append(origin)
    new_model = {**model, "ops": new_ops}
    spans = _spans(len(ops), inserted)
    groups = tuple(_moved(g, spans) for g in expansion.groups) if expansion is not None else ()
    base = expansion if expansion is not None else Expansion(new_model, (), (), ())
    moved = dataclasses.replace(base, model=new_model, groups=groups, origins=tuple(origins))
    return Attached(new_model, moved)


def _normalised(pattern: str) -> str:
    """``layers[*].qkv`` -> ``layers.*.qkv``: explain's spelling of uses, as a step name."""
    return re.sub(r"\[([^\]]*)\]", r".\1", pattern)


def _targets(
    ops: Sequence[Any], targets: Sequence[str]
) -> tuple[dict[int, set[str] | None], list[Diagnostic]]:
    """Step index -> the parts to adapt (None: all) for every step a target names."""
    names = [op.get("name") if isinstance(op, Mapping) else None for op in ops]
    linear = [i for i, op in enumerate(ops) if isinstance(op, Mapping) and op.get("op") in ADAPTED]
    head = _output_head(ops)
    chosen: dict[int, set[str] | None] = {}
    diags: list[Diagnostic] = []
    for t, target in enumerate(targets):
        path = f"{SECTION}.targets[{t}]"
        if target == ALL_LINEAR:
            for i in linear:
                if i != head:
                    chosen[i] = None
            continue
        pattern, _, part_text = target.partition(":")
        parts = {p.strip() for p in re.split(r"[,+]", part_text) if p.strip()} if part_text else None
        glob = _normalised(pattern)
        matched = [
            i for i, name in enumerate(names) if isinstance(name, str) and fnmatch.fnmatchcase(name, glob)
        ]
        if not matched:
            choices = sorted({pattern_of(str(names[i])) for i in linear})
            hint = did_you_mean(glob, choices) or (f"linear steps: {', '.join(choices)}" if choices else None)
            diags.append(error(path, "lora-target", f"target {target!r} matches no step of the model", hint))
            continue
        kept = [i for i in matched if i in linear]
        if not kept:
            kinds = sorted({str(ops[i].get("op") or ops[i].get("module")) for i in matched})
            message = (
                f"target {target!r} names {_shown(names, matched)}, which is {' and '.join(kinds)}: "
                "LoRA adapts "
                f"{' and '.join(ADAPTED)} steps"
            )
            diags.append(error(path, "lora-target", message, "name a projection (a Linear step)"))
            continue
        for i in kept:
            if parts is None:
                chosen[i] = None
            elif i not in chosen:
                chosen[i] = set(parts)
            elif chosen[i] is not None:
                chosen[i] = chosen[i] | parts  # type: ignore[operator]
    return chosen, diags


def pattern_of(name: str) -> str:
    """A step name with its use index as ``*`` (``layers.3.qkv`` -> ``layers.*.qkv``): how a ``lora.targets``
    entry names the step in every use."""
    return re.sub(r"\.\d+\.", ".*.", name)


def _shown(names: Sequence[Any], indices: Sequence[int]) -> str:
    shown = sorted({pattern_of(str(names[i])) for i in indices})
    return ", ".join(f"'{s}'" for s in shown[:4]) + (" ..." if len(shown) > 4 else "")


def _output_head(ops: Sequence[Any]) -> int | None:
    """The index of the model's last step when it is a Linear (a vocabulary head, left alone by
    ``all-linear`` as PEFT leaves it)."""
    last = len(ops) - 1
    if last >= 0 and isinstance(ops[last], Mapping) and ops[last].get("op") == "Linear":
        return last
    return None


def _parts(ops: Sequence[Any], index: int, width: int) -> tuple[tuple[str, int], ...]:
    """The named parts of step ``index``'s output, from the step it feeds: an ``Attention`` takes
    q | k | v, a gated activation gate | up; one part otherwise."""
    after: Mapping[str, Any] = (
        ops[index + 1] if index + 1 < len(ops) and isinstance(ops[index + 1], Mapping) else {}
    )
    args: Mapping[str, Any] = after["args"] if isinstance(after.get("args"), Mapping) else {}
    if after.get("module") == "Attention" and "Attention" in MODULE_ALLOWLIST:
        heads, dim = args.get("num_heads"), args.get("head_dim")
        kv = args.get("num_kv_heads") or heads
        if (
            isinstance(heads, int)
            and isinstance(kv, int)
            and isinstance(dim, int)
            and (heads + 2 * kv) * dim == width
        ):
            return (("q", heads * dim), ("k", kv * dim), ("v", kv * dim))
    spec = OPS.get(str(after.get("op")))
    if spec is not None and spec.width.divisor == 2 and width % 2 == 0:
        return (("gate", width // 2), ("up", width // 2))
    return (("all", width),)


def _branch(
    ops: Sequence[Any],
    index: int,
    wanted: set[str] | None,
    settings: LoraSettings,
    diags: list[Diagnostic],
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The steps before and after the projection at ``index``, or None (and a diagnostic)."""
    step = ops[index]
    name, args = str(step["name"]), step.get("args") if isinstance(step.get("args"), Mapping) else {}
    width_in, width_out = args.get("in_features"), args.get("out_features")
    if not isinstance(width_in, int) or not isinstance(width_out, int):
        return None  # the step's own diagnostics say what is wrong with it
    parts = _parts(ops, index, width_out)
    part_names = [p for p, _ in parts]
    if wanted is not None:
        unknown = sorted(wanted - set(part_names))
        if unknown:
            message = (
                f"step {pattern_of(name)!r} has no part {unknown[0]!r} (its parts: {', '.join(part_names)})"
            )
            diags.append(
                error(f"{SECTION}.targets", "lora-target", message, did_you_mean(unknown[0], part_names))
            )
            return None
    rank = int(settings.rank or 0)
    adapted = [wanted is None or p in wanted for p in part_names]
    narrowest = min([width_in, *(w for (_, w), on in zip(parts, adapted, strict=True) if on)])
    if rank > narrowest:
        out = "/".join(str(w) for _, w in parts) + (" (parts)" if len(parts) > 1 else "")
        message = (
            f"rank={rank} is wider than step {pattern_of(name)!r} ({width_in} in, {out} out): the update "
            "would not be low-rank"
        )
        diags.append(error(f"{SECTION}.rank", "lora-rank", message, f"use a rank of at most {narrowest}"))
        return None
    channel = f"{name}_lora_x"
    # Not in place: TE's BackwardLinearAdd would fuse the projection's dgrad into the branch's, but an
    # aliased channel is a hazard the validator warns of at every use (the fusion report shows the miss).
    keep = {
        "name": f"{name}_lora_in",
        "op": "MakeExtraOutput",
        "extra_outputs": {"out": {"channel": channel, "public": False}},
    }
    lora_args: dict[str, Any] = {
        "in_features": width_in,
        "out_features": width_out,
        "rank": rank,
        "alpha": settings.alpha,
        "dropout": settings.dropout,
        "rslora": settings.rslora,
    }
    if len(parts) > 1:
        lora_args["parts"] = [w for _, w in parts]
        if not all(adapted):
            lora_args["adapted"] = adapted
    inputs: dict[str, Any] = {"x": channel}
    kind = ADAPTED[str(step["op"])]
    if kind == "GroupedLoRA":
        lora_args = {"num_groups": args.get("num_groups"), **lora_args}
        bound = step.get("extra_inputs") if isinstance(step.get("extra_inputs"), Mapping) else {}
        inputs["split_sizes"] = bound.get("split_sizes")
    lora = {"name": f"{name}_lora", "op": kind, "args": lora_args, "extra_inputs": inputs}
    if settings.dora and not _with_dora(lora, name, diags):
        return None
    return keep, lora


def _with_dora(lora: dict[str, Any], name: str, diags: list[Diagnostic]) -> bool:
    """``lora.dora``: the adapter step ``lora`` made DoRA, its view of the projection's weight tied to
    ``name``'s; False (and why) beside experts."""
    if lora["op"] == "GroupedLoRA":
        message = f"lora.dora: step {pattern_of(name)!r} is experts (GroupedLinear); DoRA adapts Linear steps"
        diags.append(
            error(f"{SECTION}.dora", "lora-target", message, "leave the experts out of lora.targets")
        )
        return False
    lora["args"]["dora"] = True
    lora["tie_weight"] = name  # DoRA normalises the projection's own weight
    return True


def _spans(count: int, inserted: Mapping[int, Any]) -> list[tuple[int, int]]:
    """Where each old step's steps are in the new list: (first, end); an adapted step's span holds its
    ``MakeExtraOutput``, itself and its ``LoRA``."""
    spans, at = [], 0
    for index in range(count):
        size = 3 if index in inserted else 1
        spans.append((at, at + size))
        at += size
    return spans


def _moved(group: BlockGroup, spans: Sequence[tuple[int, int]]) -> BlockGroup:
    uses = []
    for use in group.uses:
        if use.num_steps == 0:
            uses.append(use)
            continue
        first, end = spans[use.first_step][0], spans[use.first_step + use.num_steps - 1][1]
        uses.append(BlockUse(use.index, first, end - first, use.dims))
    return dataclasses.replace(group, uses=tuple(uses))


__all__ = ["ADAPTED", "ALL_LINEAR", "SECTION", "LoraSettings", "attach", "pattern_of"]
