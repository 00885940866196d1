"""Pass 3d, the channel graph: which producer feeds each consumer slot, and the rules TE enforces at
fuser construction, checked before any tensor exists.

A channel may be consumed in a later fuser than its producer's (non-fusible modules between them): TE
itself keeps channels inside one fuser, so such channels are listed as ``Reroute``s, which the TE
engine carries across (``engines/te/routing.py``).

``ChannelGraph`` is the one answer to "which producer feeds this slot": the validator's rules, both
engines (through the plan), ``graph`` (also for a config with errors), ``explain`` and bench's split all
read it instead of re-deriving it from the steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from te_assembly.analysis.plan import Channel, FuserGroup, PlannedStep, PublicTensor, Reroute, SlotRef
from te_assembly.catalog import Slot
from te_assembly.diagnostics import Diagnostic, closest, did_you_mean, error, warning

RESERVED_NAMES = {"x": "the main input tensor", "y": "the main output tensor"}
"""Names no public tensor may take: the call API (``model(x, **inputs)``), ``verify`` and the reports
use them for the main path."""

SHAPES = {
    "main": "a main-path tensor",
    "rows": "one value per row",
    "token_topk": "a [tokens, top_k] tensor",
    "groups": "one value per group",
    "scalar": "a scalar",
}


@dataclass(frozen=True)
class ChannelGraph:
    fusers: list[FuserGroup]
    channels: dict[str, Channel]
    public_inputs: list[PublicTensor]
    public_outputs: list[PublicTensor]
    diagnostics: list[Diagnostic] = field(default_factory=list)
    feeds: dict[tuple[int, int], SlotRef] = field(default_factory=dict)
    """(consumer step, input slot) -> the output slot it reads: the producer in its own fuser, else the
    first one of that name. Also for bindings with an error (drawn in red by ``graph``)."""
    reroutes: tuple[Reroute, ...] = ()
    """Channels whose consumers sit in later fusers than their producer (``plan.Reroute``)."""

    def producer_of(self, step: int, slot: int) -> SlotRef | None:
        return self.feeds.get((step, slot))


def _in_path(step: PlannedStep, slot: int) -> str:
    return f"model.ops[{step.index}].extra_inputs.{step.input_slots[slot].name}"


def _out_path(step: PlannedStep, slot: int) -> str:
    return f"model.ops[{step.index}].extra_outputs.{step.output_slots[slot].name}.channel"


@dataclass(frozen=True)
class RawChannels:
    """Channel names as written anywhere in the config, also by steps or slots too broken to plan.
    A name declared or consumed only there already has its own error; reporting it again as
    dangling or unused would point at the wrong cause."""

    declared: frozenset[str] = frozenset()
    requested: frozenset[str] = frozenset()

    @classmethod
    def of(cls, raw_ops: Sequence[Any]) -> RawChannels:
        declared: set[str] = set()
        requested: set[str] = set()
        for raw in raw_ops:
            if not isinstance(raw, dict):
                continue
            outputs, inputs = raw.get("extra_outputs"), raw.get("extra_inputs")
            if isinstance(outputs, dict):
                declared.update(
                    b["channel"]
                    for b in outputs.values()
                    if isinstance(b, dict) and isinstance(b.get("channel"), str)
                )
            if isinstance(inputs, dict):
                requested.update(v for v in inputs.values() if isinstance(v, str))
        return cls(frozenset(declared), frozenset(requested))


def check_channels(
    steps: Sequence[PlannedStep | None], fusers: list[FuserGroup], raw: RawChannels = RawChannels()
) -> ChannelGraph:
    """Check every channel against TE's fuser rules and the slots' dtype, shape and width. ``steps`` are
    the width pass's output (``check_widths``): the width and shape rules read their ``in_width``. Three
    passes, in the order their findings are listed: producers, consumers, then each channel and public
    output."""
    planned = [s for s in steps if s is not None and s.kind == "op"]
    found = _Producers.of(steps, planned)
    wiring = _Wiring(steps, found, raw)
    for step in planned:
        for slot in range(len(step.input_channels)):
            wiring.consume(step, slot)
    channels, public_outputs, diags = _outputs(planned, found, wiring, raw)
    diags = [*found.diags, *wiring.diags, *diags]
    diags.extend(_name_clashes(wiring.public_inputs, "input"))
    diags.extend(_name_clashes(public_outputs, "output"))
    reroutes = _reroutes(steps, channels)
    return ChannelGraph(fusers, channels, wiring.public_inputs, public_outputs, diags, wiring.feeds, reroutes)


@dataclass
class _Producers:
    """Every channel's producer: the first by model order (a second is an error), the one in each fuser
    (a consumer is fed from its own fuser, TE's rule, even when a duplicate name elsewhere is an error),
    and all of them by name."""

    first: dict[str, SlotRef]
    local: dict[tuple[str, int | None], SlotRef]
    every: dict[str, list[SlotRef]]
    diags: list[Diagnostic]

    @classmethod
    def of(cls, steps: Sequence[PlannedStep | None], planned: Sequence[PlannedStep]) -> _Producers:
        found = cls({}, {}, {}, [])
        for step in planned:
            for slot, name in enumerate(step.output_channels):
                if name is not None:
                    found._add(steps, step, slot, name)
        return found

    def _add(self, steps: Sequence[PlannedStep | None], step: PlannedStep, slot: int, name: str) -> None:
        ref = SlotRef(step.index, slot, step.output_slots[slot].name)
        self.local.setdefault((name, step.fuser), ref)
        self.every.setdefault(name, []).append(ref)
        first = self.first.get(name)
        if first is None:
            self.first[name] = ref
            return
        other = steps[first.step]
        assert other is not None
        where = "" if other.fuser == step.fuser else " (in another fuser; channel names are model-wide)"
        message = (
            f"channel {name!r} already has a producer: {_out_path(other, first.slot)} "
            f"(step {other.name!r}){where}"
        )
        self.diags.append(error(_out_path(step, slot), "duplicate-producer", message))


class _Wiring:
    """The consumers pass: each extra input bound to its producer, or public, or an error."""

    def __init__(self, steps: Sequence[PlannedStep | None], producers: _Producers, raw: RawChannels) -> None:
        self.steps, self.producers, self.raw = steps, producers, raw
        self.consumers: dict[str, list[SlotRef]] = {name: [] for name in producers.first}
        self.feeds: dict[tuple[int, int], SlotRef] = {}
        self.misspelt: set[str] = set()
        self.public_inputs: list[PublicTensor] = []
        self.diags: list[Diagnostic] = []

    def consume(self, step: PlannedStep, slot: int) -> None:
        name = step.input_channels[slot]
        ref = SlotRef(step.index, slot, step.input_slots[slot].name)
        if name is None:
            public = PublicTensor(
                step.public_input_name(slot), ref, step.input_slots[slot].dtype, step.fuser or 0
            )
            self.public_inputs.append(public)
            return
        producers = self.producers.first
        source = self.producers.local.get((name, step.fuser)) or producers.get(name)
        if source is not None:
            self.feeds[(step.index, slot)] = source
        problem = (
            self._unbound(step, slot, name) if source is None else self._mismatch(step, slot, name, source)
        )
        if problem is not None:
            self.diags.extend(problem)
            return
        self.consumers[name].append(ref)

    def _unbound(self, step: PlannedStep, slot: int, name: str) -> list[Diagnostic]:
        path, producers = _in_path(step, slot), self.producers.first
        if name in RESERVED_NAMES:
            message = (
                f"{name!r} is {RESERVED_NAMES[name]}, not a channel: step {step.name!r} cannot take it as an "
                "extra input"
            )
            hint = "tap the main path with a MakeExtraOutput step and consume its channel"
            return [error(path, "reserved-name", message, hint)]
        if name in self.raw.declared:
            return []  # its producer's step or slot is broken and already reported
        meant = closest(name, producers)
        if meant is not None:
            self.misspelt.add(meant)
        hint = (
            did_you_mean(name, producers)
            or "bind an extra output to this name, or use null to make the input public"
        )
        message = f"channel {name!r} consumed by step {step.name!r} has no producer"
        return [error(path, "dangling-input", message, hint)]

    def _mismatch(self, step: PlannedStep, slot: int, name: str, source: SlotRef) -> list[Diagnostic] | None:
        """Why ``source`` cannot feed this slot (order, dtype, shape; disagreements are warnings that
        still bind), or None."""
        producer = self.steps[source.step]
        assert producer is not None
        path = _in_path(step, slot)
        if source.step >= step.index:
            return [self._after(step, path, name, producer)]
        dtype, produced_dtype = step.input_slots[slot].dtype, producer.output_slots[source.slot].dtype
        if produced_dtype != dtype:
            message = (
                f"slot {step.input_slots[slot].name!r} takes a {dtype} tensor but channel {name!r} carries "
                f"{produced_dtype} ({producer.type}.{source.slot_name})"
            )
            return [error(path, "channel-dtype", message)]
        mismatch = _shape_mismatch(producer, source.slot, step, slot, name, path)
        if mismatch is not None:
            return [mismatch]
        self.diags.extend(_agreement(producer, source.slot, step, slot, name))
        return None

    def _after(self, step: PlannedStep, path: str, name: str, producer: PlannedStep) -> Diagnostic:
        named = self.producers.every.get(name, [])
        if len(named) > 1:  # an earlier one exists: the name has two producers, say so
            where = ", ".join(
                f"step {self.steps[r.step].name!r} at model.ops[{r.step}]"  # type: ignore[union-attr]
                for r in named
            )
            message = (
                f"channel {name!r} has {len(named)} producers ({where}): step {step.name!r} would take it "
                f"from {producer.name!r} in its own fuser, which comes after it"
            )
            return error(path, "producer-after-consumer", message, "give each producer its own channel name")
        later = f", in a later fuser ({producer.fuser})" if producer.fuser != step.fuser else ""
        message = (
            f"channel {name!r} consumed by step {step.name!r} has no earlier producer: it is produced by "
            f"step {producer.name!r} at model.ops[{producer.index}]{later}"
        )
        return error(path, "producer-after-consumer", message, "move the producer before its consumer")


def _outputs(
    planned: Sequence[PlannedStep], producers: _Producers, wiring: _Wiring, raw: RawChannels
) -> tuple[dict[str, Channel], list[PublicTensor], list[Diagnostic]]:
    """Each channel with its consumers, the public outputs, and their findings (reserved public names,
    hidden channels nobody consumes)."""
    channels: dict[str, Channel] = {}
    public_outputs: list[PublicTensor] = []
    diags: list[Diagnostic] = []
    # A channel a misspelt consumer meant is not "unused": the dangling input's hint already names it.
    wanted = {n for s in planned for n in s.input_channels if n is not None} | raw.requested | wiring.misspelt
    for step in planned:
        for slot, public in enumerate(step.output_public):
            ref = SlotRef(step.index, slot, step.output_slots[slot].name)
            dtype, name = step.output_slots[slot].dtype, step.output_channels[slot]
            if public:
                public_name = step.public_output_name(slot)
                public_outputs.append(PublicTensor(public_name, ref, dtype, step.fuser or 0))
                if public_name in RESERVED_NAMES:
                    reserved = RESERVED_NAMES[public_name]
                    message = f"public output name {public_name!r} is reserved: it names {reserved}"
                    hint = "rename the channel, or hide it with public: false"
                    diags.append(error(_out_path(step, slot), "reserved-name", message, hint))
            if name is None or producers.first.get(name) != ref:
                continue
            consumers = tuple(wiring.consumers[name])
            channels[name] = Channel(name, dtype, step.fuser or 0, ref, consumers, public)
            # A consumer rejected for another reason (order, dtype...) already has its own error.
            if not public and not consumers and name not in wanted:
                loss = step.output_slots[slot].is_loss
                hint = (
                    "it is a loss term: make it public so the caller can add it to the objective"
                    if loss
                    else "consume it, or make it public"
                )
                message = f"hidden channel {name!r} has no consumer: it is computed and dropped"
                diags.append(warning(_out_path(step, slot), "unused-hidden-output", message, hint))
    return channels, public_outputs, diags


def _reroutes(steps: Sequence[PlannedStep | None], channels: dict[str, Channel]) -> tuple[Reroute, ...]:
    """Each channel with a consumer in a later fuser than its producer's: TE keeps channels inside one
    fuser, so the TE engine carries these across (``plan.Reroute``)."""
    out: list[Reroute] = []
    for name, channel in channels.items():
        later = [ref for ref in channel.consumers if _fuser(steps, ref.step) != channel.fuser]
        if not later:
            continue
        last = max(ref.step for ref in later)
        crosses = tuple(
            i
            for i in range(channel.producer.step + 1, last)
            if (s := steps[i]) is not None and s.kind == "module"
        )
        fusers = tuple(sorted({_fuser(steps, ref.step) for ref in later}))
        out.append(Reroute(name, channel.fuser, fusers, tuple(later), crosses))
    return tuple(out)


def _fuser(steps: Sequence[PlannedStep | None], index: int) -> int:
    step = steps[index]
    assert step is not None and step.fuser is not None
    return step.fuser


def _shape_mismatch(
    producer: PlannedStep, out_slot: int, consumer: PlannedStep, in_slot: int, name: str, path: str
) -> Diagnostic | None:
    produced, taken = producer.output_slots[out_slot], consumer.input_slots[in_slot]
    if produced.shape != taken.shape:
        return error(
            path,
            "channel-shape",
            f"slot {taken.name!r} of {consumer.type} takes {SHAPES.get(taken.shape, taken.shape)} "
            f"({taken.shape}) but channel {name!r} carries {SHAPES.get(produced.shape, produced.shape)} "
            f"({producer.type}.{produced.name}: {produced.shape})",
        )
    rows = _rows_mismatch(producer, produced, consumer, name, path)
    if rows is not None or produced.shape != "main":
        return rows
    # A main-shaped output is the tensor arriving at its producer (MakeExtraOutput passes it through).
    width, wanted = producer.in_width, consumer.slot_width(taken)
    takes = f"the main path arrives at step {consumer.name!r} (model.ops[{consumer.index}]) with width "
    if taken.width_arg is not None and consumer.args.get(taken.width_arg) is not None:
        # the slot's width is an argument's (LoRA's x: in_features)
        takes = f"slot {taken.name!r} of step {consumer.name!r} takes {taken.width_arg}="
    if width is None or wanted is None or width == wanted:
        return None
    return error(
        path,
        "channel-width",
        f"channel {name!r} has width {width} (the main path at step {producer.name!r}, "
        f"model.ops[{producer.index}]) but {takes}{wanted}",
        "tap the main path where its width matches, or project it back",
    )


_DEPTH = {0: "token rows", 1: "dispatched expert rows"}


def _rows_mismatch(
    producer: PlannedStep, produced: Slot, consumer: PlannedStep, name: str, path: str
) -> Diagnostic | None:
    """Row-shaped tensors only fit where the main path has the same rows: a residual tapped before
    Dispatch cannot be added between Dispatch and Combine, nor row_probs used after Combine."""
    if produced.shape not in ("main", "rows", "token_topk"):
        return None
    made_at = producer.row_depth
    if made_at is not None and produced.shape == "rows":
        made_at += getattr(producer.spec, "rows_delta", 0)  # Dispatch's outputs describe its output rows
    wanted = consumer.row_depth
    if made_at is None or wanted is None or made_at == wanted:
        return None
    return error(
        path,
        "channel-rows",
        f"channel {name!r} carries {_DEPTH.get(made_at, f'rows at dispatch depth {made_at}')} "
        f"(from step {producer.name!r}) but step {consumer.name!r} runs on "
        f"{_DEPTH.get(wanted, f'rows at dispatch depth {wanted}')}",
        "consume it on the same side of Dispatch/Combine as it was made",
    )


def _agreement(
    producer: PlannedStep, out_slot: int, consumer: PlannedStep, in_slot: int, name: str
) -> list[Diagnostic]:
    produced = dict(producer.output_slots[out_slot].agree)
    out: list[Diagnostic] = []
    if not (producer.args_valid and consumer.args_valid):
        return out
    for role, arg in consumer.input_slots[in_slot].agree:
        if role not in produced:
            continue
        mine, theirs = consumer.args.get(arg), producer.args.get(produced[role])
        if mine != theirs:
            out.append(
                error(
                    f"model.ops[{consumer.index}].args.{arg}",
                    "channel-args-mismatch",
                    f"{arg}={mine} but channel {name!r} comes from step {producer.name!r} "
                    f"with {produced[role]}={theirs}",
                    f"set {arg}: {theirs}",
                )
            )
    return out


def _name_clashes(tensors: list[PublicTensor], kind: str) -> list[Diagnostic]:
    seen: dict[str, PublicTensor] = {}
    out: list[Diagnostic] = []
    for t in tensors:
        if t.name in seen:
            out.append(
                error(
                    f"model.ops[{t.ref.step}]",
                    "public-name-clash",
                    f"public {kind} name {t.name!r} is used twice (also model.ops[{seen[t.name].ref.step}])",
                    "rename a step or a channel",
                )
            )
        seen[t.name] = t
    return out
