"""Which of TE's fused ops will fire in each fuser, and why each near miss misses.

The scan is TE's (``catalog/fusions.py``): per fuser, the basic ops in forward order; the joint
fusions, then the forward ones on that result, then the backward ones; each fused op replaces the
leftmost run of basic ops that matches its pattern and meets its conditions, and is matched by nothing
after. A *near miss* is a run whose op types match a pattern but that fails a condition: each failing
condition is named with the change that would make it fire and, for the in-place flags, whether that
change is safe here (TE's in-place hazards, judged from the channel graph).

The conditions outside the plan (recipe, weight dtype, GPU generation, environment, kernels) come as a
``FusionTarget``. Pure Python, like the validator: no torch, no TE.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from te_assembly.analysis.plan import Plan, PlannedStep
from te_assembly.catalog import MODULE_ALLOWLIST, OPS
from te_assembly.catalog.devices import ACCELERATORS
from te_assembly.catalog.fusions import FUSIONS, Fusion, Member
from te_assembly.diagnostics import Diagnostic, warning
from te_assembly.sections import setting

TARGETS = ("cpu", *ACCELERATORS)
"""What ``fusions.target`` may name: a CPU, or an accelerator of ``catalog/devices.py``."""

KEEPS_INPUT = frozenset(
    {"BasicLinear", "GroupedLinear", "LayerNorm", "RMSNorm", "ScaledSwiGLU", "Dropout"}
    | {"GELU", "GEGLU", "QGELU", "QGEGLU", "ReLU", "ReGLU", "SReLU", "SReGLU", "SiLU", "SwiGLU"}
)
"""Basic ops that keep their input for backward: an in-place write into that tensor corrupts it."""


@dataclass(frozen=True)
class FusionSettings:
    """``fusions:``: which machine ``explain`` and ``validate`` judge TE's fusions for."""

    target: str | None = setting(
        None,
        choices=TARGETS,
        doc="cpu or an accelerator (null: cpu, since a config cannot know its GPU; name one to ask)",
    )
    warn: bool = setting(False, doc="validate warns of each near miss (a fusion that misses by a setting)")


@dataclass(frozen=True)
class FusionTarget:
    """Where the model would run: what decides the conditions a plan does not."""

    name: str = "cpu"
    """For messages: ``cpu``, ``h100``..."""
    capability: tuple[int, int] | None = None
    """CUDA compute capability; None on a CPU."""
    recipe_kind: str | None = None
    """The quantization recipe's kind; None without one (the ``none`` kind included)."""
    backward_override: str | None = None
    dtype: str = "float32"
    """The parameters' dtype."""
    kernels: str = "te"
    env: Mapping[str, str] = field(default_factory=dict)
    tensor_parallel: int = 1
    """``parallel.tensor``: only above 1 are Linears built with their ``tensor_parallel_mode``."""

    @classmethod
    def of(
        cls,
        target: str | None,
        *,
        recipe: Mapping[str, Any] | None,
        dtype: str,
        kernels: str = "te",
        env: Mapping[str, str] | None = None,
        tensor_parallel: int = 1,
    ) -> FusionTarget:
        """``target``: ``cpu``, an accelerator's short name, or None (``cpu``: a config cannot know the
        GPU it will get; name one to ask about it)."""
        name = target or "cpu"
        capability = ACCELERATORS[name].capability if name in ACCELERATORS else None
        kind = str(recipe.get("kind")) if recipe else None
        override = recipe.get("backward_override") if recipe else None
        return cls(
            name,
            capability,
            None if kind in (None, "none") else kind,
            override if isinstance(override, str) else None,
            dtype,
            kernels,
            dict(os.environ if env is None else env),
            tensor_parallel,
        )


@dataclass(frozen=True)
class BasicOp:
    step: PlannedStep
    index: int
    """Fuser-local basic-op index (TE's)."""
    type: str
    """Catalog name of TE's basic op, or ``""`` for one of te_assembly's own ops (an adapter)."""
    args: Mapping[str, Any]

    @property
    def label(self) -> str:
        return f"{self.step.name} ({self.type or self.step.type})"


@dataclass(frozen=True)
class Fired:
    fusion: Fusion
    ops: tuple[BasicOp, ...]

    @property
    def steps(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(op.step.name for op in self.ops))


@dataclass(frozen=True)
class Miss:
    """One failing condition of a near miss."""

    condition: str
    change: str
    """What would make it fire (empty: nothing a config can change)."""
    safe: bool | None = None
    """For a change of an ``in_place`` flag: whether TE's in-place hazard applies here."""
    why: str = ""


@dataclass(frozen=True)
class NearMiss:
    fusion: Fusion
    ops: tuple[BasicOp, ...]
    misses: tuple[Miss, ...]

    @property
    def steps(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(op.step.name for op in self.ops))


@dataclass(frozen=True)
class FuserFusions:
    fuser: int
    forward: tuple[Fired, ...]
    backward: tuple[Fired, ...]
    near_misses: tuple[NearMiss, ...]

    @property
    def fired(self) -> tuple[Fired, ...]:
        return self.forward + self.backward


def near_miss_warnings(plan: Plan, results: Sequence[FuserFusions]) -> list[Diagnostic]:
    """``fusions.warn``: one warning per near miss that a config change would make fire, at its first
    step, with the change (and whether it is safe) as the hint."""
    out = []
    for fuser in results:
        for near in fuser.near_misses:
            changes = [m for m in near.misses if m.change]
            if len(changes) != len(near.misses):
                continue  # some condition no setting changes: not a near miss worth a warning
            first = near.ops[0].step
            kind = "op" if first.kind == "op" else "module"
            hint = "; ".join(
                m.change + ("" if m.safe is None else f" ({'safe' if m.safe else 'unsafe'}: {m.why})")
                for m in changes
            )
            out.append(
                warning(
                    f"model.ops[{first.index}].{kind}",
                    "fusion-near-miss",
                    f"{near.fusion.name} would fuse {', '.join(near.steps)} in fuser {fuser.fuser} but: "
                    + "; ".join(m.condition for m in near.misses),
                    hint,
                )
            )
    return out


def without_te_kernel(plan: Plan) -> dict[tuple[str, str], list[str]]:
    """(module type, what TE lacks) -> the steps that run the reference module in the TE engine
    because TE's class has no kernel for an argument they set (``ModuleSpec.te_lacks``)."""
    out: dict[tuple[str, str], list[str]] = {}
    for step in plan.steps:
        module = MODULE_ALLOWLIST.get(step.type) if step.kind == "module" else None
        missing = module.te_missing(step.args) if module is not None else []
        if missing:
            out.setdefault((step.type, ", ".join(missing)), []).append(step.name)
    return out


def basic_ops(plan: Plan, fuser: int, kernels: str = "te") -> list[BasicOp]:
    """The fuser's basic ops as TE sees them: TE's own ops by catalog name; te_assembly's ops (and, with
    ``kernels=reference``, every op) are adapters that no pattern matches."""
    out = []
    for index in plan.fusers[fuser].steps:
        step = plan.steps_by_index[index]
        for offset, (name, args) in enumerate(step.basic_ops):
            spec = OPS.get(name)
            te_op = kernels == "te" and spec is not None and spec.te_class is not None
            out.append(BasicOp(step, step.first_basic_op + offset, name if te_op else "", args))
    return out


def predict(plan: Plan, target: FusionTarget) -> list[FuserFusions]:
    """Per fuser (see the module docstring)."""
    results = []
    for group in plan.fusers:
        ops: list[BasicOp | Fired] = list(basic_ops(plan, group.index, target.kernels))
        near: list[NearMiss] = []
        joint = _scan_all(ops, "joint", plan, target, near)
        forward = _scan_all(list(joint), "forward", plan, target, near)
        backward = _scan_all(list(joint), "backward", plan, target, near)
        fired_joint = [o for o in joint if isinstance(o, Fired)]
        results.append(
            FuserFusions(
                group.index,
                tuple(o for o in forward if isinstance(o, Fired)),
                tuple(o for o in backward if isinstance(o, Fired) and o not in fired_joint),
                tuple(near),
            )
        )
    return results


def _scan_all(
    ops: list[BasicOp | Fired], passes: str, plan: Plan, target: FusionTarget, near: list[NearMiss]
) -> list[BasicOp | Fired]:
    for fusion in FUSIONS:
        if fusion.passes == passes and not fusion.userbuffers:  # te_assembly sets up no Userbuffers
            ops = _scan(ops, fusion, plan, target, near)
    return ops


def _scan(
    ops: list[BasicOp | Fired], fusion: Fusion, plan: Plan, target: FusionTarget, near: list[NearMiss]
) -> list[BasicOp | Fired]:
    out: list[BasicOp | Fired] = []
    i = 0
    while i < len(ops):
        window = _match_types(ops, i, fusion.members)
        if window is None:
            out.append(ops[i])
            i += 1
            continue
        members, taken = window
        misses = _misses(fusion, members, taken, plan, target)
        if misses:
            near.append(NearMiss(fusion, tuple(taken), tuple(misses)))
            out.append(ops[i])
            i += 1
            continue
        kept = [op for op, m in zip(taken, members, strict=True) if not m.in_fused_op]
        fused = tuple(op for op, m in zip(taken, members, strict=True) if m.in_fused_op)
        out.extend([*kept, Fired(fusion, fused)])
        i += len(taken)
    return out


def _match_types(
    ops: Sequence[BasicOp | Fired], start: int, members: Sequence[Member]
) -> tuple[list[Member], list[BasicOp]] | None:
    """The members and ops of a run starting at ``start`` whose types match (optional members skipped
    when absent); None when it does not."""
    taken: list[BasicOp] = []
    used: list[Member] = []
    j = start
    for member in members:
        op = ops[j] if j < len(ops) else None
        if isinstance(op, BasicOp) and op.type in member.types:
            taken.append(op)
            used.append(member)
            j += 1
        elif not member.optional:
            return None
    return used, taken


def _misses(
    fusion: Fusion, members: Sequence[Member], ops: Sequence[BasicOp], plan: Plan, target: FusionTarget
) -> list[Miss]:
    """Why ``fusion`` does not fire on ``ops``: its members' arguments, then what it asks of the run,
    then of the widths."""
    out: list[Miss] = []
    for member, op in zip(members, ops, strict=True):
        for arg, wanted in member.args:
            if op.args.get(arg, op.step.args.get(arg)) != wanted:
                out.append(_arg_miss(op, arg, wanted, plan))
        mode = op.step.args.get("tensor_parallel_mode") if target.tensor_parallel > 1 else None
        if mode in member.not_tensor_parallel:
            out.append(Miss(f"{op.step.name} is {mode}-parallel (TE communicates around its GEMM)", ""))
    return out + _run_misses(fusion, target) + _width_misses(fusion, ops)


def _run_misses(fusion: Fusion, target: FusionTarget) -> list[Miss]:
    """The recipe, weight dtype, GPU and environment the fusion needs."""
    out: list[Miss] = []
    if fusion.recipe == "required" and (target.recipe_kind is None or target.backward_override is not None):
        this = f" (this one has backward_override={target.backward_override})" if target.recipe_kind else ""
        why = "needs a quantization recipe without backward_override" + this
        out.append(Miss(why, "recipe=fp8_current (or another quantization recipe)"))
    elif fusion.recipe not in ("any", "required") and target.recipe_kind not in fusion.recipe.split(","):
        kinds = " or ".join(fusion.recipe.split(","))
        out.append(Miss(f"needs a {kinds} recipe (this: {target.recipe_kind or 'none'})", "recipe=mxfp8"))
    if fusion.weight_dtypes and target.dtype not in fusion.weight_dtypes:
        why = f"needs {' or '.join(fusion.weight_dtypes)} weights (this: {target.dtype})"
        out.append(Miss(why, f"dtype={fusion.weight_dtypes[0]}"))
    if fusion.capability_major is not None and (
        target.capability is None or target.capability[0] != fusion.capability_major
    ):
        have = "a CPU" if target.capability is None else f"sm_{target.capability[0]}{target.capability[1]}"
        why = f"needs compute capability {fusion.capability_major}.x (Blackwell); {target.name} is {have}"
        out.append(Miss(why, "a Blackwell GPU (fusions.target=b200 asks about one)"))
    for var, value in fusion.env:
        if target.env.get(var) != value:
            out.append(Miss(f"needs {var}={value} in the environment", f"export {var}={value}"))
    return out


def _width_misses(fusion: Fusion, ops: Sequence[BasicOp]) -> list[Miss]:
    """The grouped GEMMs' widths the fusion needs."""
    out: list[Miss] = []
    grouped = [op for op in ops if op.type == "GroupedLinear"]
    if fusion.dims_multiple is not None:
        for op in grouped:
            dims = (op.args.get("in_features"), op.args.get("out_features"))
            if any(not isinstance(d, int) or d % fusion.dims_multiple for d in dims):
                why = (
                    f"{op.step.name}'s in and out features ({dims[0]}, {dims[1]}) must be multiples of "
                    f"{fusion.dims_multiple}"
                )
                out.append(Miss(why, f"widths that are multiples of {fusion.dims_multiple}"))
    if fusion.glu_pair and len(grouped) == 2:
        fc1, fc2 = grouped
        if fc1.args.get("out_features") != 2 * int(fc2.args.get("in_features") or 0):
            out.append(
                Miss(f"{fc1.step.name}'s out features must be twice {fc2.step.name}'s in features", "")
            )
    return out


def _arg_miss(op: BasicOp, arg: str, wanted: Any, plan: Plan) -> Miss:
    path = f"{op.step.name}.args.{arg}"
    if arg != "in_place":
        return Miss(
            f"{op.step.name} ({op.type}) needs {arg}={wanted}",
            "" if arg not in op.step.spec.params_by_name else f"{path}: {wanted}",
            why="te_assembly's op has no such argument" if arg not in op.step.spec.params_by_name else "",
        )
    condition = f"{op.step.name} ({op.type}) has in_place: {not wanted}"
    safe, why = _in_place_safe(op, wanted, plan)
    return Miss(condition, f"{path}: {str(wanted).lower()}", safe, why)


def _in_place_safe(op: BasicOp, wanted: bool, plan: Plan) -> tuple[bool, str]:
    """Whether switching ``op``'s ``in_place`` to ``wanted`` is safe here (TE's hazards)."""
    step = op.step
    if not wanted:
        return True, "an out-of-place op has no aliasing hazard"
    if step.type == "MakeExtraOutput":
        channel = step.output_channels[0] if step.output_channels else None
        if channel is None or step.output_public[0]:
            return False, "the caller gets the tensor too: TE would accumulate into its gradient in place"
        consumers = plan.channels[channel].consumers
        if len(consumers) != 1:
            return False, f"channel {channel!r} has {len(consumers)} consumers, whose gradients would alias"
        return True, (
            f"channel {channel!r} has one consumer and is not public (TE still calls in-place gradient "
            "accumulation an advanced feature)"
        )
    # AddExtraInput: the result is written into the addend tensor itself.
    channel = step.input_channels[0] if step.input_channels else None
    if channel is None:
        return False, "the addend is the caller's tensor: an in-place add would overwrite it"
    info = plan.channels[channel]
    if info.public or len(info.consumers) != 1:
        return False, f"channel {channel!r} is also read elsewhere (public or another consumer)"
    producer = plan.steps_by_index[info.producer.step]
    if producer.fuser != step.fuser:
        return False, f"channel {channel!r} comes from another fuser (rerouted across a module)"
    if producer.type != "MakeExtraOutput":
        return True, f"channel {channel!r} is {producer.name}'s own output, read only here"
    before, after = _neighbours(plan, producer)
    if before is None:
        return False, (
            f"channel {channel!r} is the tensor the fuser was called with ({producer.name} taps it first: "
            "the caller's x, or what the module before returned): an in-place add would overwrite it"
        )
    if after is None:
        return False, f"{producer.name} taps the fuser's output, which the caller gets"
    if after.type in KEEPS_INPUT:
        return False, (
            f"channel {channel!r} is the tensor {producer.name} passes on to {after.step.name} "
            f"({after.type}), which keeps it for backward: an in-place add would overwrite it"
        )
    return True, f"nothing keeps channel {channel!r}'s tensor for backward"


def _neighbours(plan: Plan, step: PlannedStep) -> tuple[BasicOp | None, BasicOp | None]:
    """The basic ops just before and after ``step``'s (a one-op step) in its fuser."""
    ops = basic_ops(plan, step.fuser) if step.fuser is not None else []
    for i, op in enumerate(ops):
        if op.step.index == step.index:
            return (ops[i - 1] if i > 0 else None), (ops[i + 1] if i + 1 < len(ops) else None)
    return None, None


__all__ = [
    "TARGETS",
    "BasicOp",
    "Fired",
    "FuserFusions",
    "FusionSettings",
    "FusionTarget",
    "Miss",
    "NearMiss",
    "basic_ops",
    "near_miss_warnings",
    "predict",
    "without_te_kernel",
]
