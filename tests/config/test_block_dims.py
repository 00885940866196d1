"""Which dims a block use gets: the block's own, then the model step's, then the use's, and a
command-line ``block.<name>.dims.X=V`` over all of them; each level is tested to win over the one before,
and what cannot be applied is refused with the reason."""

from __future__ import annotations

from typing import Any

import te_assembly
from te_assembly.analysis.analyze import Analysis

BLOCK = {
    "dims": {"width": 4, "out": 5},
    "ops": [
        {
            "name": "lin",
            "op": "Linear",
            "args": {"in_features": "${block.dims.width}", "out_features": "${block.dims.out}"},
        }
    ],
}


def _model(
    step_dims: dict[str, Any] | None = None, uses: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    step: dict[str, Any] = {"name": "layers", "block": "layer"}
    if step_dims is not None:
        step["dims"] = step_dims
    if uses is not None:
        step["uses"] = [{"dims": u} for u in uses]
    else:
        step["repeat"] = 2
    # every layer maps width -> out; a Linear back to width keeps the chain valid whatever out is
    return {"name": "dims_order", "in_features": 4, "blocks": {"layer": BLOCK}, "ops": [step]}


def _outs(analysis: Analysis) -> list[int]:
    return [s.args["out_features"] for s in analysis.checked_plan().steps]


def test_block_dims_are_the_default() -> None:
    block = {**BLOCK, "dims": {"width": 4, "out": 4}}
    model = {**_model(), "blocks": {"layer": block}}
    assert _outs(te_assembly.load(model)) == [4, 4]


def test_the_step_wins_over_the_block_and_the_use_over_the_step() -> None:
    block = {**BLOCK, "dims": {"width": 4, "out": 9}}
    steps = te_assembly.load({**_model({"out": 4}), "blocks": {"layer": block}})
    assert _outs(steps) == [4, 4]
    uses = te_assembly.load({**_model({"out": 9}, uses=[{"out": 4}, {"out": 4}]), "blocks": {"layer": block}})
    assert _outs(uses) == [4, 4]
    mixed = te_assembly.load({**_model({"out": 4}, uses=[{}, {"width": 4}]), "blocks": {"layer": block}})
    assert _outs(mixed) == [4, 4]


def test_a_command_line_block_override_wins_over_every_level() -> None:
    """moe_lm's step sets experts for its moe_layer block; block.moe_layer.dims.experts=8 still applies."""
    plain = te_assembly.load("moe_lm")
    forced = te_assembly.load("moe_lm", ["block.moe_layer.dims.experts=8"])
    routers = [s for s in forced.checked_plan().steps if s.type == "TopKRouter"]
    assert [s.args["num_experts"] for s in routers] == [8, 8]
    assert [s.args["num_experts"] for s in plain.checked_plan().steps if s.type == "TopKRouter"] == [4, 4]


def test_a_bad_block_override_is_refused() -> None:
    typed = te_assembly.load("moe_lm", ["block.moe_layer.dims.experts=abc"])
    assert any("must be int" in d.message and "'abc'" in d.message for d in typed.errors)
    removed = te_assembly.load("moe_lm", ["block.moe_layer=null"])
    assert any(d.code == "bad-override" and "key by key" in d.message for d in removed.errors)
    typo = te_assembly.load("moe_lm", ["block.moe_layer.dims.expert=8"])
    (d,) = typo.errors
    assert d.hint is not None and "block.moe_layer.dims.experts" in d.hint
    block_typo = te_assembly.load("moe_lm", ["block.moe_layr.dims.experts=8"])
    (d,) = block_typo.errors
    assert d.hint is not None and "moe_layer" in d.hint


def test_a_diagnostic_caused_by_a_block_override_names_it() -> None:
    """The error sits at the block file's line (where the default is); the override that gave the bad
    value is named beside it, through the ${block.dims.X} the value reads, or set directly."""
    through_dim = te_assembly.load("moe_lm", ["block.moe_layer.dims.experts=abc"])
    assert through_dim.errors and all(
        d.override == "block.moe_layer.dims.experts=abc" for d in through_dim.errors
    )
    assert all(d.file is not None and d.file.endswith("moe_layer.yaml") for d in through_dim.errors)
    direct = te_assembly.load("moe_lm", ["block.moe_layer.ops.9.args.top_k=9"])
    named = [d for d in direct.errors if d.override == "block.moe_layer.ops.9.args.top_k=9"]
    assert named, [d.format() for d in direct.errors]
    unrelated = te_assembly.load("moe_lm", ["block.moe_layer.dims.ffn=64", "model.dims.top_k=9"])
    assert unrelated.errors and all(d.override != "block.moe_layer.dims.ffn=64" for d in unrelated.errors)


def test_names_in_a_block_diagnostic_say_which_uses() -> None:
    """A mistake every use shares names its steps and channels as explain does (layers[0-1].add), and
    its hint keeps the name to write in the block."""
    block = {
        "dims": {"width": 4},
        "ops": [
            {"name": "add", "op": "AddExtraInput", "extra_inputs": {"addend": "res"}},
            {"name": "lin", "op": "Linear", "args": {"in_features": 5, "out_features": 4}},
        ],
    }
    model = {
        "name": "m",
        "in_features": 4,
        "blocks": {"layer": block},
        "ops": [{"name": "layers", "block": "layer", "repeat": 2}],
    }
    errors = te_assembly.load(model).errors
    dangling = next(d for d in errors if d.path.endswith("extra_inputs.addend"))
    assert dangling.path.startswith("model.layers[0-1] (block layer)")
    assert "'layers[0-1].res'" in dangling.message and "'layers[0-1].add'" in dangling.message
    width = next(d for d in errors if d.path.endswith("args.in_features"))
    assert "'layers[0-1].lin'" in width.message and width.hint == "set in_features: 4"
