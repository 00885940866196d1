"""A model as its author wrote it: steps of its own, and block steps collapsed to one item per run of
identical uses (same dims), unless asked to show them step by step. ``explain`` and ``graph`` both draw
from this.

``expand`` (the ``explain.expand`` / ``graph.expand`` setting) names what to show step by step: ``all``,
a block step (``layers``: every use), or one use (``layers.3``: that use; the others stay collapsed, one
item per run of uses). Pure Python: no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from te_assembly.analysis.plan import BlockGroup, BlockUse, PlannedStep, Reroute
from te_assembly.config.block_names import use_ranges
from te_assembly.diagnostics import Diagnostic, did_you_mean, error
from te_assembly.fields import FieldSpec
from te_assembly.sections import setting

ALL = "all"


@dataclass(frozen=True)
class Expand:
    """What to show step by step."""

    everything: bool = False
    groups: frozenset[str] = frozenset()
    uses: frozenset[tuple[str, int]] = frozenset()

    def group(self, name: str) -> bool:
        return self.everything or name in self.groups

    def use(self, name: str, use: int) -> bool:
        return self.group(name) or (name, use) in self.uses


def parse_expand(
    names: Sequence[str], blocks: Sequence[BlockGroup], path: str
) -> tuple[Expand, list[Diagnostic]]:
    """``expand`` names checked against the model's block steps: ``all``, ``<step>`` or ``<step>.<use>``."""
    groups = {g.name: g for g in blocks}
    choices = [ALL, *groups]
    out = Expand()
    diags: list[Diagnostic] = []
    for i, name in enumerate(names):
        where = f"{path}[{i}]" if len(names) > 1 else path
        if name == ALL:
            out = Expand(True, out.groups, out.uses)
            continue
        if name in groups:
            out = Expand(out.everything, out.groups | {name}, out.uses)
            continue
        head, _, tail = name.rpartition(".")
        if head in groups and tail.isdigit():
            count = len(groups[head].uses)
            if int(tail) < count:
                out = Expand(out.everything, out.groups, out.uses | {(head, int(tail))})
                continue
            message = f"{head} has {count} use(s), numbered 0-{count - 1}; got {name!r}"
            diags.append(error(where, "out-of-range", message))
            continue
        listed = ", ".join(choices) if groups else f"{ALL} (this model uses no blocks)"
        message = f"{name!r} is no block step of this model: expand one of {listed}, or <step>.<use>"
        diags.append(error(where, "bad-choice", message, did_you_mean(name, choices)))
    return out, diags


EXPAND_DOC = (
    "block steps to show step by step: all, a block step (layers) or one use (layers.3); "
    "empty: one line per run of identical uses"
)
"""The doc of the ``expand`` field of the ``explain:`` and ``graph:`` sections."""


@dataclass(frozen=True)
class ExplainSettings:
    """The ``explain:`` section."""

    expand: list[str] = setting([], doc=EXPAND_DOC, items=FieldSpec(str), single_as_list=True)


@dataclass(frozen=True, eq=False)
class Uses:
    """Uses of one block step shown as one item (compared and hashed by identity)."""

    group: BlockGroup
    uses: tuple[BlockUse, ...]

    @property
    def steps(self) -> range:
        return range(self.uses[0].first_step, self.uses[-1].first_step + self.uses[-1].num_steps)

    @property
    def label(self) -> str:
        """``layers[0-23]``: the block step and the uses this item stands for."""
        return f"{self.group.name}[{use_ranges([u.index for u in self.uses])}]"

    @property
    def what(self) -> str:
        return f"block {self.group.block} x {len(self.uses)}"


Item = int | Uses
"""A step (its index) or a collapsed run of uses."""


def outline(num_steps: int, blocks: Sequence[BlockGroup], expand: Expand) -> list[Item]:
    """The model's items in order (module docstring)."""
    starts = {g.steps.start: g for g in blocks if g.uses}
    items: list[Item] = []
    index = 0
    while index < num_steps:
        group = starts.get(index)
        if group is None or expand.group(group.name):
            items.append(index)
            index += 1
            continue
        run: list[BlockUse] = []
        for use in group.uses:
            if expand.use(group.name, use.index):
                if run:
                    items.append(Uses(group, tuple(run)))
                    run = []
                items.extend(use.steps)
            else:
                if run and use.dims != run[-1].dims:  # other dims, other steps: a row of their own
                    items.append(Uses(group, tuple(run)))
                    run = []
                run.append(use)
        if run:
            items.append(Uses(group, tuple(run)))
        index = group.steps.stop
    return items


def collapsed_steps(items: Iterable[Item]) -> dict[int, Uses]:
    """Step index -> the collapsed item that holds it."""
    return {i: item for item in items if isinstance(item, Uses) for i in item.steps}


def use_of(blocks: Sequence[BlockGroup], index: int) -> tuple[BlockGroup, BlockUse] | None:
    """The block step and use a step belongs to, if any."""
    for group in blocks:
        if index in group.steps:
            for use in group.uses:
                if index in use.steps:
                    return group, use
    return None


def local_name(name: str, group: BlockGroup, use: BlockUse) -> str:
    """``layers.3.residual`` -> ``residual``."""
    prefix = group.prefix(use.index)
    return name[len(prefix) :] if name.startswith(prefix) else name


class Outline:
    """A plan's items (``outline``) and how a collapsed item names what it holds: use-relative, under
    the item's label (``layers[0-23].residual``)."""

    def __init__(self, num_steps: int, blocks: Sequence[BlockGroup], expand: Expand | None = None) -> None:
        self.blocks = tuple(blocks)
        self.items = outline(num_steps, self.blocks, expand or Expand())
        self.collapsed = collapsed_steps(self.items)

    def item_of(self, step: int) -> Uses | None:
        return self.collapsed.get(step)

    def local(self, step: int, name: str) -> str:
        """``name`` (a step's, channel's or public tensor's, of step ``step``'s use) as shown: itself,
        or ``layers[0-23].residual`` when the step is inside a collapsed item."""
        item = self.item_of(step)
        found = use_of(self.blocks, step) if item is not None else None
        if item is None or found is None:
            return name
        group, use = found
        return f"{item.label}.{local_name(name, group, use)}"

    def crossed(self, reroute: Reroute, steps: Sequence[PlannedStep | None]) -> str:
        """The modules a rerouted channel crosses, each collapsed item's once: ``attn (Attention)``,
        ``layers[0-23].attn (Attention)``."""
        names = (
            f"{self.local(i, s.name)} ({s.type})" for i, s in ((i, steps[i]) for i in reroute.crosses) if s
        )
        return ", ".join(dict.fromkeys(names)) or "-"

    def describe(self, reroute: Reroute, steps: Sequence[PlannedStep | None]) -> str:
        """``fuser 0 -> 1, 2 across attn (Attention)``; a channel of a collapsed item's uses, with fusers
        counted from its producer's, as the same in each use: ``fuser +0 -> +1 across attn (Attention)
        (in each use)``."""
        consumer = reroute.consumers[0].step if reroute.consumers else None
        found = use_of(self.blocks, consumer) if consumer is not None else None
        if (
            found is not None
            and consumer is not None
            and self.item_of(consumer) is not None
            and reroute.channel.startswith(found[0].prefix(found[1].index))  # the use's own channel
        ):
            group, use = found
            crossed = [s for s in (steps[i] for i in reroute.crosses) if s is not None]
            modules = ", ".join(f"{local_name(s.name, group, use)} ({s.type})" for s in crossed) or "-"
            later = ", ".join(f"+{f - reroute.producer_fuser}" for f in reroute.consumer_fusers)
            return f"fuser +0 -> {later} across {modules} (in each use)"
        later = ", ".join(str(f) for f in reroute.consumer_fusers)
        return f"fuser {reroute.producer_fuser} -> {later} across {self.crossed(reroute, steps)}"


__all__ = [
    "ALL",
    "EXPAND_DOC",
    "Expand",
    "ExplainSettings",
    "Item",
    "Outline",
    "Uses",
    "collapsed_steps",
    "local_name",
    "outline",
    "parse_expand",
    "use_of",
]
