"""Attention and token views at config level: the width formula, the argument rules, the main path's
layout (x's declared or inferred layout, token views, residuals across them), whole sequences for the
synthetic batches, the recipe and the parallel layout. Everything before any tensor exists."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from te_assembly import load
from te_assembly.analysis.recipe_shapes import recipe_shape_diagnostics
from te_assembly.analysis.recipes import load_recipe
from te_assembly.catalog import MODULE_ALLOWLIST, Formula
from te_assembly.diagnostics import Diagnostic

HIDDEN, HEADS, KV, HEAD_DIM = 16, 4, 2, 4
QKV = (HEADS + 2 * KV) * HEAD_DIM  # 32


def _attention_model(**attention_args: Any) -> dict[str, Any]:
    args = {"num_heads": HEADS, "num_kv_heads": KV, "head_dim": HEAD_DIM, "rotary": True, **attention_args}
    return {
        "name": "attn",
        "in_features": HIDDEN,
        "ops": [
            {"name": "norm", "op": "RMSNorm", "args": {"normalized_shape": HIDDEN}},
            {"name": "qkv", "op": "Linear", "args": {"in_features": HIDDEN, "out_features": QKV}},
            {"name": "attn", "module": "Attention", "args": args},
            {
                "name": "proj",
                "op": "Linear",
                "args": {"in_features": HEADS * HEAD_DIM, "out_features": HIDDEN},
            },
        ],
    }


MOE_TAIL = [
    {
        "name": "router",
        "op": "TopKRouter",
        "args": {"in_features": HIDDEN, "num_experts": 2, "top_k": 1},
        "extra_outputs": {
            "probs": {"channel": "probs", "public": False},
            "routing_map": {"channel": "routing_map", "public": False},
            "aux_loss": {"channel": "aux_loss", "public": True},
        },
    },
    {
        "name": "dispatch",
        "op": "Dispatch",
        "args": {"num_experts": 2, "top_k": 1},
        "extra_inputs": {"probs": "probs", "routing_map": "routing_map"},
        "extra_outputs": {
            "split_sizes": {"channel": "split_sizes", "public": False},
            "row_probs": {"channel": "row_probs", "public": False},
            "row_map": {"channel": "row_map", "public": False},
        },
    },
    {
        "name": "experts",
        "op": "GroupedLinear",
        "args": {"num_groups": 2, "in_features": HIDDEN, "out_features": HIDDEN},
        "extra_inputs": {"split_sizes": "split_sizes"},
    },
    {"name": "combine", "op": "Combine", "args": {"top_k": 1}, "extra_inputs": {"row_map": "row_map"}},
]

FLATTEN = {
    "name": "flatten",
    "op": "FlattenTokens",
    "extra_outputs": {"token_shape": {"channel": "token_shape", "public": False}},
}
RESTORE = {"name": "restore", "op": "RestoreTokens", "extra_inputs": {"token_shape": "token_shape"}}


def _decoder(*, views: bool = True) -> dict[str, Any]:
    model = _attention_model()
    tail = copy.deepcopy(MOE_TAIL)
    model["ops"] += [copy.deepcopy(FLATTEN), *tail, copy.deepcopy(RESTORE)] if views else tail
    return model


def _codes(model: dict[str, Any], *overrides: str) -> list[tuple[str, str]]:
    return [(d.path, d.code) for d in load(model, overrides).diagnostics if d.is_error]


def _errors(config: dict[str, Any]) -> list[Diagnostic]:
    return [d for d in load(config).diagnostics if d.is_error]


# --------------------------------------------------------------------------------------------- widths


def test_the_width_rule_is_a_formula_of_the_arguments() -> None:
    rule = MODULE_ALLOWLIST["Attention"].width
    assert rule.in_formula == Formula("(num_heads + 2*num_kv_heads) * head_dim")
    assert rule.in_formula is not None and rule.out_formula is not None
    assert rule.in_formula.value({"num_heads": 6, "num_kv_heads": 2, "head_dim": 8}) == (6 + 4) * 8
    assert rule.out_formula.value({"num_heads": 6, "num_kv_heads": 2, "head_dim": 8}) == 48
    assert rule.in_formula.value({"num_heads": 6, "num_kv_heads": None, "head_dim": 8}) is None


def test_a_valid_attention_model_plans_its_widths_and_defaults() -> None:
    model = _attention_model()
    del model["ops"][2]["args"]["num_kv_heads"]  # null/missing: one kv head per query head
    model["ops"][1]["args"]["out_features"] = 3 * HEADS * HEAD_DIM
    plan = load(model).checked_plan()
    attn = plan.step("attn")
    assert attn.args["num_kv_heads"] == HEADS
    assert (attn.in_width, attn.out_width) == (3 * HEADS * HEAD_DIM, HEADS * HEAD_DIM)
    assert attn.kind == "module" and attn.num_params == 0
    assert plan.input_layout == "sequence" and "'attn'" in plan.input_layout_source
    assert [f.ended_by for f in plan.fusers] == [2, None]


def test_qkv_width_that_does_not_fit_the_heads_is_reported_with_the_formula() -> None:
    model = _attention_model()
    model["ops"][1]["args"]["out_features"] = QKV + 4
    errors = [d for d in load(model).diagnostics if d.is_error]
    assert [(d.path, d.code) for d in errors] == [("model.ops[2].args", "width-mismatch")]
    message = errors[0].message
    assert "(num_heads + 2*num_kv_heads) * head_dim = (4 + 2*2) * 4 = 32" in message
    assert "arrives with width 36" in message


def test_the_output_width_reaches_the_next_step() -> None:
    model = _attention_model()
    model["ops"][3]["args"]["in_features"] = QKV  # the packed width, not the heads' output width
    assert _codes(model) == [("model.ops[3].args.in_features", "width-mismatch")]


@pytest.mark.parametrize(
    ("args", "path", "code"),
    [
        ({"num_kv_heads": 3}, "model.ops[2].args.num_heads", "not-a-multiple"),
        ({"head_dim": 3}, "model.ops[2].args.head_dim", "not-a-multiple"),  # odd head_dim with rotary
        ({"rotary_base": 0.5}, "model.ops[2].args.rotary_base", "out-of-range"),
        ({"num_heads": 0}, "model.ops[2].args.num_heads", "out-of-range"),
        ({"heads": 4}, "model.ops[2].args.heads", "unknown-arg"),
        ({"causal": "yes"}, "model.ops[2].args.causal", "wrong-type"),
    ],
)
def test_attention_arguments_are_checked(args: dict[str, Any], path: str, code: str) -> None:
    model = _attention_model(**args)
    assert (path, code) in _codes(model)


def test_odd_head_dim_is_fine_without_rotary() -> None:
    model = _attention_model(head_dim=3, rotary=False)
    model["ops"][1]["args"]["out_features"] = (HEADS + 2 * KV) * 3
    model["ops"][3]["args"]["in_features"] = HEADS * 3
    assert _codes(model) == []


def test_attention_has_no_extra_tensor_slots() -> None:
    model = _attention_model()
    model["ops"][2]["extra_inputs"] = {"mask": None}
    assert ("model.ops[2].extra_inputs", "module-slots") in _codes(model)


# --------------------------------------------------------------------------------------------- layouts


def test_a_decoder_with_token_views_is_valid_and_tracks_each_layout() -> None:
    plan = load(_decoder()).checked_plan()
    assert plan.input_layout == "sequence"
    layouts = {s.name: s.layout for s in plan.steps}
    assert layouts == {
        "norm": "sequence",
        "qkv": "sequence",
        "attn": "sequence",
        "proj": "sequence",
        "flatten": "sequence",
        "router": "tokens",
        "dispatch": "tokens",
        "experts": "tokens",
        "combine": "tokens",
        "restore": "tokens",
    }


def test_dispatch_after_attention_without_token_views_is_refused_with_the_fix() -> None:
    errors = _errors(_decoder(views=False))
    assert [(d.path, d.code) for d in errors] == [
        ("model.ops[5].op", "layout-mismatch"),  # dispatch
        ("model.ops[7].op", "layout-mismatch"),  # combine
    ]
    assert "needs the main path as [tokens, features]" in errors[0].message
    assert "[batch, seq, features]" in errors[0].message and "'attn'" in errors[0].message
    assert errors[0].hint is not None and "FlattenTokens" in errors[0].hint


def test_attention_inside_a_token_view_is_refused() -> None:
    model = _attention_model()  # norm, flatten, qkv, attn, proj: attention on token rows
    model["ops"].insert(1, copy.deepcopy(FLATTEN))
    model["ops"][1]["extra_outputs"]["token_shape"]["public"] = True
    errors = _errors(model)
    assert [(d.path, d.code) for d in errors] == [("model.ops[3].module", "layout-mismatch")]
    assert "after FlattenTokens step 'flatten' at model.ops[1]" in errors[0].message
    assert errors[0].hint is not None and "outside the FlattenTokens" in errors[0].hint


@pytest.mark.parametrize(("declared", "ok"), [("sequence", True), ("tokens", False), ("any", False)])
def test_a_declared_input_layout_is_checked_against_the_steps(declared: str, ok: bool) -> None:
    model = {**_attention_model(), "input_layout": declared}
    errors = _codes(model)
    assert (errors == []) is ok
    if not ok:
        assert errors == [("model.ops[2].module", "layout-mismatch")]


def test_input_layout_must_be_a_known_layout() -> None:
    assert _codes({**_attention_model(), "input_layout": "seq"}) == [("model.input_layout", "bad-choice")]


def test_inferred_layouts_keep_todays_models_as_they_were() -> None:
    assert load("moe_block").checked_plan().input_layout == "tokens"
    assert load("residual_mlp").checked_plan().input_layout == "any"
    assert load("two_stage").checked_plan().input_layout == "any"


def test_moe_on_any_input_through_token_views() -> None:
    """FlattenTokens lets the MoE ops take x of any rank: the layout is no longer forced to 2-D."""
    model = {
        "name": "moe_views",
        "in_features": HIDDEN,
        "ops": [copy.deepcopy(FLATTEN), *copy.deepcopy(MOE_TAIL), copy.deepcopy(RESTORE)],
    }
    plan = load(model).checked_plan()
    assert plan.input_layout == "any"
    assert plan.step("restore").layout == "tokens" and plan.step("router").layout == "tokens"


def test_a_residual_across_a_token_view_is_refused() -> None:
    model = _decoder()
    ops = model["ops"]
    ops.insert(
        4,
        {
            "name": "tap",
            "op": "MakeExtraOutput",
            "extra_outputs": {"out": {"channel": "res", "public": False}},
        },
    )
    # consumed between Combine and RestoreTokens: token rows there, [batch, seq, features] where tapped
    ops.insert(len(ops) - 1, {"name": "add", "op": "AddExtraInput", "extra_inputs": {"addend": "res"}})
    errors = _errors(model)
    assert [(d.path, d.code) for d in errors] == [
        (f"model.ops[{len(ops) - 2}].extra_inputs.addend", "channel-layout")
    ]
    assert "(sequence, at step 'tap')" in errors[0].message


def test_a_residual_around_the_whole_token_view_is_fine() -> None:
    model = _decoder()
    ops = model["ops"]
    ops.insert(
        4,
        {
            "name": "tap",
            "op": "MakeExtraOutput",
            "extra_outputs": {"out": {"channel": "res", "public": False}},
        },
    )
    ops.append({"name": "add", "op": "AddExtraInput", "extra_inputs": {"addend": "res"}})
    assert _codes(model) == []


def test_token_shape_only_joins_token_shape_slots() -> None:
    model = _decoder()
    model["ops"][-1]["extra_inputs"] = {"token_shape": "split_sizes"}
    codes = _codes(model)
    assert (f"model.ops[{len(model['ops']) - 1}].extra_inputs.token_shape", "channel-shape") in codes


def test_restore_with_a_public_token_shape_is_valid() -> None:
    model = _decoder()
    model["ops"][-1]["extra_inputs"] = {"token_shape": None}
    model["ops"][4]["extra_outputs"] = {"token_shape": {"channel": "token_shape", "public": True}}
    plan = load(model).checked_plan()
    assert [t.name for t in plan.public_inputs] == ["restore_token_shape"]


# ------------------------------------------------------------------------------------ synthetic batches


@pytest.mark.parametrize(
    ("section", "key", "tokens"),
    [("run", "tokens", 100), ("train", "batch_tokens", 40), ("bench", "tokens", 33)],
)
def test_synthetic_batches_must_be_whole_sequences(section: str, key: str, tokens: int) -> None:
    from te_assembly.analysis.analyze import COMMON_SECTIONS
    from te_assembly.analysis.settings import RunSettings
    from te_assembly.jobs.bench.settings import BenchSettings
    from te_assembly.jobs.train.settings import TrainSettings

    classes = {"run": RunSettings, "train": TrainSettings, "bench": BenchSettings}
    sections = {**COMMON_SECTIONS, section: classes[section]}
    config = {"model": _attention_model(), section: {key: tokens, "seq_len": 16}}
    errors = [d for d in load(config, sections=sections).diagnostics if d.is_error]
    assert [(d.path, d.code) for d in errors] == [(f"{section}.{key}", "partial-sequence")]
    assert errors[0].hint is not None and f"{section}.{key}={tokens - tokens % 16}" in errors[0].hint
    config[section][key] = tokens - tokens % 16
    assert load(config, sections=sections).plan is not None


def test_whole_sequences_are_not_asked_of_other_models() -> None:
    assert load({"model": load("residual_mlp").resolved.model, "run": {"tokens": 100, "seq_len": 16}}).plan


# ------------------------------------------------------------------------------------- recipe, parallel


def test_fp8_attention_is_refused_but_fp8_linears_are_fine() -> None:
    plan = load(_attention_model()).checked_plan()
    recipe = load_recipe("fp8_delayed")
    assert [d for d in recipe_shape_diagnostics(plan.steps, recipe) if d.is_error] == []
    errors = [d for d in recipe_shape_diagnostics(plan.steps, {**recipe, "fp8_dpa": True}) if d.is_error]
    assert [(d.path, d.code) for d in errors] == [("recipe.fp8_dpa", "recipe-fp8-attention")]
    no_attention = load("residual_mlp").checked_plan()
    assert recipe_shape_diagnostics(no_attention.steps, {**recipe, "fp8_dpa": True}) == []


def test_attention_cannot_sit_in_a_tensor_parallel_region() -> None:
    model = _attention_model()
    model["ops"][1]["args"]["tensor_parallel_mode"] = "column"
    model["ops"][3]["args"]["tensor_parallel_mode"] = "row"
    errors = _errors({"model": model, "parallel": {"tensor": 2}})
    assert [(d.path, d.code) for d in errors] == [("model.ops[2].module", "parallel-needs-whole-features")]
    assert errors[0].hint is not None and "does not split attention by heads" in errors[0].hint


def test_sequence_parallelism_is_refused_with_attention() -> None:
    errors = _errors({"model": _attention_model(), "parallel": {"tensor": 2, "sequence": 2}})
    assert [(d.path, d.code) for d in errors] == [("parallel.sequence", "parallel-sequence-attention")]
    # data parallelism splits whole sequences: fine
    assert _errors({"model": _attention_model(), "parallel": {"data": 2}}) == []


def test_ranks_read_whole_sequences() -> None:
    from te_assembly.analysis.parallel.checks import tokens_diagnostics
    from te_assembly.analysis.parallel.settings import ParallelSettings

    settings = ParallelSettings.from_mapping({"data": 4})
    assert tokens_diagnostics(settings, 128, "run.tokens", seq_len=32) == []
    found = tokens_diagnostics(settings, 96, "run.tokens", seq_len=32)  # 3 sequences for 4 ranks
    assert [(d.path, d.code) for d in found] == [("run.tokens", "parallel-indivisible")]
    assert "3 sequences of 32" in found[0].message and "multiple of 128" in (found[0].hint or "")
    assert tokens_diagnostics(settings, 96, "run.tokens") == []  # rows: 96 split 4 ways


def test_the_readme_attention_example_is_valid() -> None:

    import yaml

    from tests.docs_text import block_after

    marker = "## Attention, token views and input layouts"
    block = block_after("guides/configs-and-blocks.md", marker, "yaml")
    plan = load(yaml.safe_load(block)).checked_plan()
    assert plan.input_layout == "sequence"
    assert (plan.step("attn").in_width, plan.step("attn").out_width) == (128, 64)


@pytest.mark.parametrize("kv_heads", [0, -2])
def test_num_kv_heads_must_be_positive(kv_heads: int) -> None:
    """Not 'width = None': a count below one is refused as what it is, at its key."""
    from te_assembly.analysis.pipeline import load

    found = load("dense_transformer", [f"model.dims.kv_heads={kv_heads}"]).diagnostics
    messages = [d.message for d in found if d.is_error]
    assert any(f"num_kv_heads must be positive, got {kv_heads}" in m for m in messages), messages
    assert not any("= None" in m for m in messages)
