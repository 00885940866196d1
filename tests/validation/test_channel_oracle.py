"""Property test: the validator's channel-graph verdict equals a small independent oracle's.

The oracle below restates TE's fuser rules (docs/te-channels.md) from scratch: it shares no code with
``te_assembly.analysis``. Generated models are otherwise valid (all widths equal, expert count and top_k
the same everywhere), so every error must come from the channel graph.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from te_assembly.analysis.pipeline import load

WIDTH, EXPERTS, TOP_K = 8, 4, 2
POOL = ("a", "b", "c")
CHANNEL_CODES = {
    "dangling-input",
    "producer-after-consumer",
    "duplicate-producer",
    "channel-dtype",
    "channel-shape",
    "channel-rows",
}
# Dispatch turns each token into top_k expert rows; Combine folds them back. Rows-like tensors (main,
# rows, token_topk) only fit at the same depth; a Dispatch's row outputs live at its output depth.
ROW_DELTA = {"Dispatch": 1, "Combine": -1}

# (extra input slots, extra output slots) as (name, dtype, shape), in TE slot order; written out here on
# purpose rather than read from the catalog, so a catalog mistake shows up as a disagreement. Shapes:
# main (like x at the op), rows (one value per row), token_topk ([tokens, top_k]), groups, scalar.
SLOTS: dict[str, tuple[tuple[tuple[str, str, str], ...], tuple[tuple[str, str, str], ...]]] = {
    "MakeExtraOutput": ((), (("out", "float", "main"),)),
    "AddExtraInput": ((("addend", "float", "main"),), ()),
    "TopKRouter": (
        (),
        (
            ("probs", "float", "token_topk"),
            ("routing_map", "int", "token_topk"),
            ("aux_loss", "float", "scalar"),
        ),
    ),
    "Dispatch": (
        (("probs", "float", "token_topk"), ("routing_map", "int", "token_topk")),
        (("split_sizes", "int", "groups"), ("row_probs", "float", "rows"), ("row_map", "int", "rows")),
    ),
    "Combine": ((("row_map", "int", "rows"),), ()),
    "GroupedLinear": ((("split_sizes", "int", "groups"),), ()),
    "GroupedLinearScaled": ((("split_sizes", "int", "groups"), ("scales", "float", "rows")), ()),
    "ScaledSwiGLU": ((("scales", "float", "rows"),), ()),
    "Bias": ((), ()),
    "Linear": ((), ()),
    "Identity": ((), ()),  # the torch module: ends the fuser
}
KINDS = sorted(SLOTS)
RESIDUAL_KINDS = ["MakeExtraOutput", "Identity", "AddExtraInput", "Bias"]
"""Half the models are built from these alone: residuals around modules, channels carried across them."""
Units = list[tuple[dict[str, Any], str]]
"""Each generated step with its kind (a key of SLOTS)."""


def _steps_for(kind: str, name: str, data: st.DataObject) -> list[dict[str, Any]]:
    """The YAML step(s) for one generated unit, without channel bindings."""
    if kind == "Identity":
        return [{"name": name, "module": "Identity"}]
    args: dict[str, Any] = {
        "TopKRouter": {"in_features": WIDTH, "num_experts": EXPERTS, "top_k": TOP_K},
        "Dispatch": {"num_experts": EXPERTS, "top_k": TOP_K},
        "Combine": {"top_k": TOP_K},
        "GroupedLinear": {"num_groups": EXPERTS, "in_features": WIDTH, "out_features": WIDTH},
        "GroupedLinearScaled": {
            "num_groups": EXPERTS,
            "in_features": WIDTH,
            "out_features": WIDTH,
            "scale_bias": True,
        },
        "Bias": {"size": WIDTH},
        "Linear": {"in_features": WIDTH, "out_features": WIDTH, "bias": data.draw(st.booleans())},
    }.get(kind, {})
    op = "GroupedLinear" if kind == "GroupedLinearScaled" else kind
    steps = [{"name": name, "op": op, **({"args": args} if args else {})}]
    if kind == "ScaledSwiGLU":  # restores the width it halves
        steps.append(
            {
                "name": f"{name}_proj",
                "op": "Linear",
                "args": {"in_features": WIDTH // 2, "out_features": WIDTH, "bias": False},
            }
        )
    return steps


def _bind(step: dict[str, Any], kind: str, data: st.DataObject, produced: list[tuple[str, str, str]]) -> None:
    """Bind slots at random, leaning towards names that make sense (an earlier producer of the same
    dtype and shape, a fresh output name) so that valid graphs come up often, not only broken ones."""
    inputs, outputs = SLOTS[kind]
    bound_in: dict[str, Any] = {}
    for slot, dtype, shape in inputs:
        earlier = [name for name, dt, sh in produced if (dt, sh) == (dtype, shape)]
        choices: list[Any] = [POOL[0], None, "<absent>", *(earlier * 4)]
        choice = data.draw(st.sampled_from(choices))
        if choice != "<absent>":
            bound_in[slot] = choice
    bound_out: dict[str, Any] = {}
    for slot, dtype, shape in outputs:
        fresh = f"{step['name']}_{slot[:2]}"
        choice = data.draw(st.sampled_from([*POOL, *[fresh] * 4, None, "<absent>"]))
        if choice == "<absent>":
            continue
        binding: dict[str, Any] = {"channel": choice}
        if choice is not None:  # public: false needs a channel (a separate rule, not tested here)
            produced.append((choice, dtype, shape))
            public = data.draw(st.sampled_from([True, False, "<absent>"]))
            if public != "<absent>":
                binding["public"] = public
        bound_out[slot] = binding
    if bound_in:
        step["extra_inputs"] = bound_in
    if bound_out:
        step["extra_outputs"] = bound_out


@st.composite
def models(draw: st.DrawFn) -> tuple[dict[str, Any], list[tuple[dict[str, Any], str]]]:
    data = draw(st.data())
    kinds = draw(
        st.lists(st.sampled_from(draw(st.sampled_from([KINDS, RESIDUAL_KINDS]))), min_size=1, max_size=9)
    )
    ops: list[dict[str, Any]] = []
    units: list[tuple[dict[str, Any], str]] = []
    produced: list[tuple[str, str, str]] = []
    for i, kind in enumerate(kinds):
        steps = _steps_for(kind, f"s{i}", data)
        _bind(steps[0], kind, data, produced)
        units.extend((s, kind if j == 0 else "Linear") for j, s in enumerate(steps))
        ops.extend(steps)
    return {"name": "generated", "in_features": WIDTH, "ops": ops}, units


# ----------------------------------------------------------------------------------------------------
# The oracle


@dataclass
class Verdict:
    errors: set[tuple[int, str, str]]
    """(step index, slot name, rule code)."""
    public_inputs: list[tuple[str, int]]
    """(name, fuser), in TE's calling order."""
    public_outputs: list[tuple[str, int]]
    reroutes: dict[str, tuple[int, ...]]
    """Channel -> the later fusers it is carried to (for a valid graph)."""


def oracle(units: list[tuple[dict[str, Any], str]]) -> Verdict:
    # Fusers: maximal runs of fusible ops; a module ends the run. Empty runs are not fusers.
    fuser_of: dict[int, int] = {}
    basic_of: dict[int, int] = {}  # fuser-local index of the step's (first) basic op
    depth_of: dict[int, int] = {}  # dispatch depth of the main path arriving at the step
    fuser, basic, open_run, depth = 0, 0, False, 0
    for i, (step, kind) in enumerate(units):
        depth_of[i] = depth
        depth += ROW_DELTA.get(kind, 0)
        if kind == "Identity":
            if open_run:
                fuser, basic, open_run = fuser + 1, 0, False
            continue
        fuser_of[i], basic_of[i], open_run = fuser, basic, True
        # te.ops.Linear expands to BasicLinear + Bias: two basic ops.
        basic += 2 if step["op"] == "Linear" and step["args"].get("bias", True) else 1

    def inputs(i: int) -> list[tuple[str, str, str, str | None]]:
        step, kind = units[i]
        return [(s, dt, sh, step.get("extra_inputs", {}).get(s)) for s, dt, sh in SLOTS[kind][0]]

    def outputs(i: int) -> list[tuple[str, str, str, str | None, bool]]:
        step, kind = units[i]
        out = []
        for s, dt, sh in SLOTS[kind][1]:
            b = step.get("extra_outputs", {}).get(s, {})
            out.append((s, dt, sh, b.get("channel"), not (b.get("channel") and b.get("public") is False)))
        return out

    ops = sorted(fuser_of)
    errors: set[tuple[int, str, str]] = set()
    carried: dict[str, set[int]] = {}
    # name -> [(step, slot, dtype, shape, depth)] in model order
    producers: dict[str, list[tuple[int, str, str, str, int]]] = {}
    for i in ops:
        for slot, dtype, shape, channel, _ in outputs(i):
            if channel is not None:
                if channel in producers:
                    # TE: two producers in one fuser. te_assembly: channel names are model-wide.
                    errors.add((i, slot, "duplicate-producer"))
                made_at = depth_of[i] + (ROW_DELTA.get(units[i][1], 0) if shape == "rows" else 0)
                producers.setdefault(channel, []).append((i, slot, dtype, shape, made_at))
    for i in ops:
        for slot, dtype, shape, channel in inputs(i):
            if channel is None:
                continue
            # A consumer reads its name's producer in its own fuser (TE's rule); failing that, the
            # model's producer of that name in an earlier fuser, carried across the modules between
            # them (te_assembly reroutes it).
            local = [p for p in producers.get(channel, []) if fuser_of[p[0]] == fuser_of[i]]
            source = local[0] if local else producers[channel][0] if channel in producers else None
            if source is None:
                errors.add((i, slot, "dangling-input"))
            elif source[0] >= i:
                errors.add((i, slot, "producer-after-consumer"))
            elif source[2] != dtype:
                errors.add((i, slot, "channel-dtype"))
            elif source[3] != shape:
                # Widths never differ here (the generator keeps them equal), so a main-shaped channel
                # between main-shaped slots is always sound.
                errors.add((i, slot, "channel-shape"))
            elif shape in ("main", "rows", "token_topk") and source[4] != depth_of[i]:
                errors.add((i, slot, "channel-rows"))
            elif fuser_of[source[0]] != fuser_of[i]:
                carried.setdefault(channel, set()).add(fuser_of[i])

    public_in = sorted(
        (fuser_of[i], basic_of[i], k, f"{units[i][0]['name']}_{slot}")
        for i in ops
        for k, (slot, _, _, channel) in enumerate(inputs(i))
        if channel is None
    )
    public_out = sorted(
        (fuser_of[i], basic_of[i], k, channel or f"{units[i][0]['name']}_{slot}")
        for i in ops
        for k, (slot, _, _, channel, public) in enumerate(outputs(i))
        if public
    )
    reroutes = {name: tuple(sorted(fusers)) for name, fusers in carried.items()}
    return Verdict(
        errors, [(n, f) for f, _, _, n in public_in], [(n, f) for f, _, _, n in public_out], reroutes
    )


_PATH = re.compile(r"^model\.ops\[(\d+)\]\.extra_(?:inputs|outputs)\.(\w+)")


def _check(model: dict[str, Any], units: Units) -> None:
    expected = oracle(units)
    analysis = load(model)
    diags, plan = analysis.diagnostics, analysis.plan
    errors = [d for d in diags if d.is_error]
    got: set[tuple[int, str, str]] = set()
    for d in errors:
        if d.code in CHANNEL_CODES:
            m = _PATH.match(d.path)
            assert m, d.format()
            got.add((int(m.group(1)), m.group(2), d.code))
    others = {d.code for d in errors if d.code not in CHANNEL_CODES}
    shown = "\n".join(d.format() for d in errors)
    assert got == expected.errors, shown
    # Two public producers of one name also clash as public outputs; nothing else may go wrong.
    assert others <= {"public-name-clash"} and (not others or expected.errors), shown
    assert (plan is not None) == (not expected.errors), shown
    event("valid" if plan is not None else "invalid")
    for code in sorted({e[2] for e in expected.errors}):
        event(code)
    if plan is not None:
        assert [(t.name, t.fuser) for t in plan.public_inputs] == expected.public_inputs
        assert [(t.name, t.fuser) for t in plan.public_outputs] == expected.public_outputs
        assert {r.channel: r.consumer_fusers for r in plan.reroutes} == expected.reroutes
        if expected.reroutes:
            event("rerouted")


def _unit(step: dict[str, Any]) -> tuple[dict[str, Any], str]:
    kind = step.get("module") or step["op"]
    if kind == "GroupedLinear" and step["args"].get("scale_bias"):
        kind = "GroupedLinearScaled"
    return step, kind


def _fixed(*steps: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[dict[str, Any], str]]]:
    return {"name": "fixed", "in_features": WIDTH, "ops": list(steps)}, [_unit(s) for s in steps]


_TAP = {"op": "MakeExtraOutput", "extra_outputs": {"out": {"channel": "a", "public": False}}}
_ADD = {"op": "AddExtraInput", "extra_inputs": {"addend": "a"}}
_SPLIT = {"module": "Identity"}


@settings(
    max_examples=int(os.environ.get("ORACLE_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(models())
# One name produced in two fusers, consumed after the second producer: only the duplicate is an error.
@example(
    _fixed({"name": "p0", **_TAP}, {"name": "m", **_SPLIT}, {"name": "p1", **_TAP}, {"name": "c", **_ADD})
)
# ... and consumed before the second producer in its fuser: TE finds no earlier producer there.
@example(
    _fixed({"name": "p0", **_TAP}, {"name": "m", **_SPLIT}, {"name": "c", **_ADD}, {"name": "p1", **_TAP})
)
# Consumed across a module, in a later fuser: valid (rerouted); and in an earlier fuser: no earlier producer.
@example(_fixed({"name": "p0", **_TAP}, {"name": "m", **_SPLIT}, {"name": "c", **_ADD}))
@example(_fixed({"name": "c", **_ADD}, {"name": "m", **_SPLIT}, {"name": "p0", **_TAP}))
def test_channel_verdict_matches_oracle(generated: tuple[dict[str, Any], Units]) -> None:
    _check(*generated)
