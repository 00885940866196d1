"""Pass 3e, the main path's layout: how many dimensions the tensor has at each step.

Most ops work on the last dimension of ``[..., features]`` and keep whatever layout arrives. A few need
one (the catalog's ``needs_layout``): ``Dispatch`` and ``Combine`` move 2-D token rows
(``[tokens, features]``), ``Attention`` mixes the positions of ``[batch, seq, features]``. Token views
change it: ``FlattenTokens`` makes token rows and records the leading dimensions on its ``token_shape``
channel; the ``RestoreTokens`` that reads that channel gives back the layout ``FlattenTokens`` received.

An ``Embedding`` needs ``token_ids`` (``x`` itself, integer ids) and leaves ``sequence``; no other step
may see the ids.

``x``'s layout is the model's ``input_layout`` (``any``, ``tokens``, ``sequence``, ``token_ids``); left
out, the first step that needs a layout of ``x`` itself (no token view between) decides it, and ``any``
otherwise. So ``moe_block`` (Dispatch on ``x``) takes ``[tokens, features]``, ``residual_mlp`` any
``[..., features]``.

Runs after the channel pass: a ``RestoreTokens`` finds its ``FlattenTokens`` through the channel graph,
and main-path channels must join steps where the main path has the same layout (a residual tapped before
``FlattenTokens`` cannot be added after it). Returns the steps with ``layout`` set (new objects).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from te_assembly.analysis.channels import ChannelGraph
from te_assembly.analysis.plan import PlannedStep
from te_assembly.catalog import LAYOUTS
from te_assembly.diagnostics import Diagnostic, error

X = "x"
"""The symbolic layout "whatever x is", until ``input_layout`` or a step decides it."""
UNKNOWN = "unknown"
"""Past a step too broken to plan: not checked."""
RESTORED = "restored"
"""After a RestoreTokens fed a public token_shape: ``[*token_shape, features]``, whatever the caller's
token_shape says (not checked here; the call checks its row count)."""


@dataclass(frozen=True)
class LayoutResult:
    steps: list[PlannedStep | None]
    input_layout: str
    """``any``, ``tokens`` or ``sequence``: what ``x`` must look like."""
    source: str
    """Why (for messages): ``input_layout: sequence``, or the step that needs it."""
    diagnostics: list[Diagnostic]


def check_layouts(
    steps: Sequence[PlannedStep | None], declared: object, graph: ChannelGraph | None
) -> LayoutResult:
    """See the module docstring. ``declared``: the model's ``input_layout`` (None: inferred; anything
    that is not a layout name is reported by the schema check and treated as None)."""
    diags: list[Diagnostic] = []
    fixed = declared if isinstance(declared, str) and declared in LAYOUTS else None
    decided = fixed
    source = f"from input_layout: {fixed}" if fixed is not None else ""
    arriving: dict[int, str] = {}
    """Symbolic layout arriving at each step (``X`` until resolved)."""
    why: dict[int, str] = {}
    """What gave the arriving layout, for messages."""
    current, current_why = X, "x"
    for step in steps:
        if step is None:
            current, current_why = UNKNOWN, ""
            continue
        arriving[step.index] = current
        why[step.index] = current_why
        need = getattr(step.spec, "needs_layout", None)
        if need is not None:
            if current == X and decided is None:
                decided = need
                source = f"because step {step.name!r} ({step.type}) at model.ops[{step.index}] needs it"
            else:
                actual = decided if current == X else current
                if actual is not None and actual not in (need, UNKNOWN, RESTORED) and step.args_valid:
                    came = f"x's layout, {source}" if current == X else current_why
                    diags.append(_needs(step, need, actual, came, current == X and fixed is not None))
        sets = getattr(step.spec, "sets_layout", None)
        if sets == "sequence":  # an Embedding: token ids in, [batch, seq, dim] out
            current, current_why = (
                "sequence",
                f"after {step.type} step {step.name!r} at model.ops[{step.index}]",
            )
        elif sets == "tokens":
            current, current_why = (
                "tokens",
                f"after FlattenTokens step {step.name!r} at model.ops[{step.index}]",
            )
        elif sets == "token_shape":
            current, current_why = _restored(step, steps, graph, arriving, why)
    resolved = decided or "any"
    if resolved == "token_ids":
        diags.extend(_on_token_ids(steps, arriving, source))
    result: list[PlannedStep | None] = []
    for step in steps:
        if step is None:
            result.append(None)
            continue
        symbolic = arriving[step.index]
        layout = resolved if symbolic == X else ("any" if symbolic == UNKNOWN else symbolic)
        result.append(step.evolve(layout=layout))
    unchecked = {i for i, v in arriving.items() if v in (UNKNOWN, RESTORED)}
    diags.extend(_channel_layouts(result, graph, unchecked))
    return LayoutResult(result, resolved, source or "no step needs a particular one", diags)


def _restored(
    step: PlannedStep,
    steps: Sequence[PlannedStep | None],
    graph: ChannelGraph | None,
    arriving: Mapping[int, str],
    why: Mapping[int, str],
) -> tuple[str, str]:
    """The layout a RestoreTokens gives back: the one its token_shape's FlattenTokens received."""
    slot = next((i for i, s in enumerate(step.input_slots) if s.shape == "token_shape"), None)
    ref = graph.producer_of(step.index, slot) if graph is not None and slot is not None else None
    producer = steps[ref.step] if ref is not None and ref.step < len(steps) else None
    if producer is None or getattr(producer.spec, "sets_layout", None) != "tokens":
        return RESTORED, ""  # a public token_shape: the caller says at call time
    restored = arriving.get(producer.index, UNKNOWN)
    return restored, why.get(producer.index, "") if restored != X else "x"


def _on_token_ids(
    steps: Sequence[PlannedStep | None], arriving: Mapping[int, str], source: str
) -> list[Diagnostic]:
    """Steps that would get the model's token ids (x itself) without needing them: only an Embedding
    can take integer ids."""
    out = []
    for step in steps:
        if step is None or arriving.get(step.index) != X or step.spec.needs_layout == "token_ids":
            continue
        kind = "op" if step.kind == "op" else "module"
        out.append(
            error(
                f"model.ops[{step.index}].{kind}",
                "layout-mismatch",
                f"{step.type} step {step.name!r} would receive the model's token ids "
                f"({LAYOUTS['token_ids']}, {source}), which only an Embedding step takes",
                "make an Embedding the first step, so every other step works on its [batch, seq, dim] output",
            )
        )
    return out


def _needs(step: PlannedStep, need: str, actual: str, came: str, declared: bool) -> Diagnostic:
    kind = "op" if step.kind == "op" else "module"
    if need == "token_ids":
        hint = (
            "an Embedding takes the model's own token ids: make it the first step (input_layout: token_ids)"
        )
    elif need == "tokens":
        hint = (
            "put a FlattenTokens step before it (before the router), and a RestoreTokens after the Combine "
            "that reads FlattenTokens' token_shape channel"
        )
    elif declared:
        hint = f"declare input_layout: {need}, or move the step outside the token view"
    else:
        hint = "run it outside the FlattenTokens ... RestoreTokens span, where the main path keeps its layout"
    return error(
        f"model.ops[{step.index}].{kind}",
        "layout-mismatch",
        f"{step.type} step {step.name!r} needs the main path as {LAYOUTS[need]} ({need}), but it arrives as "
        f"{LAYOUTS.get(actual, actual)} ({actual}: {came})",
        hint,
    )


def _channel_layouts(
    steps: Sequence[PlannedStep | None], graph: ChannelGraph | None, unknown: set[int]
) -> list[Diagnostic]:
    """A main-path channel (a residual) joins steps where the main path has the same layout (``unknown``:
    steps whose layout is not known here: past a broken step, or set by a caller's token_shape)."""
    if graph is None:
        return []
    out: list[Diagnostic] = []
    for name, channel in graph.channels.items():
        producer = steps[channel.producer.step] if channel.producer.step < len(steps) else None
        if producer is None or producer.index in unknown:
            continue
        if producer.output_slots[channel.producer.slot].shape != "main":
            continue
        for ref in channel.consumers:
            consumer = steps[ref.step] if ref.step < len(steps) else None
            if consumer is None or ref.step in unknown or consumer.layout == producer.layout:
                continue
            made, wanted = producer.layout or "any", consumer.layout or "any"
            out.append(
                error(
                    f"model.ops[{consumer.index}].extra_inputs.{ref.slot_name}",
                    "channel-layout",
                    f"channel {name!r} carries the main path as {LAYOUTS.get(made, made)} ({made}, at step "
                    f"{producer.name!r}) but step {consumer.name!r} runs on {LAYOUTS.get(wanted, wanted)} "
                    f"({wanted})",
                    "tap and consume it on the same side of FlattenTokens / RestoreTokens",
                )
            )
    return out


__all__ = ["LayoutResult", "X", "check_layouts"]
