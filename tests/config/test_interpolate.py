"""Interpolations resolved once, leaf by leaf: the fast path for ``${model.X}`` and ``${mul:...}``,
OmegaConf for anything else, one diagnostic per leaf that does not resolve."""

from __future__ import annotations

from typing import Any

import pytest

from te_assembly.config.interpolate import Interpolator, find_sites, resolve_sites


def _resolve(model: dict[str, Any], context: dict[str, Any] | None = None) -> tuple[Any, dict[str, str]]:
    interpolator = Interpolator({"model": model}, context=lambda: dict(context or {}))
    data, diags = resolve_sites(interpolator, "model", find_sites(model), "model")
    return data, {d.path: d.message for d in diags}


def test_whole_value_references_keep_their_type_and_chain() -> None:
    model = {"dims": {"h": 8, "two_h": "${model.dims.h}"}, "in_features": "${model.dims.two_h}"}
    data, problems = _resolve(model)
    assert problems == {} and data["in_features"] == 8 and isinstance(data["in_features"], int)
    assert model["in_features"] == "${model.dims.two_h}"  # the input is not modified


def test_mul_multiplies_numbers_and_nested_references() -> None:
    data, problems = _resolve({"dims": {"f": 3}, "a": "${mul:2,${model.dims.f}}", "b": "${mul:0.5,4}"})
    assert problems == {} and data["a"] == 6 and data["b"] == 2.0


@pytest.mark.parametrize("expression", ["${mul:abc,100000000}", "${mul:true,3}", "${mul:'7',2}"])
def test_mul_takes_numbers_only(expression: str) -> None:
    data, problems = _resolve({"a": expression})
    assert "a" not in data
    assert "mul takes numbers" in problems["model.a"]


def test_add_sums_numbers_and_nests_with_mul() -> None:
    model = {
        "dims": {"heads": 4, "kv": 2, "d": 16},
        "qkv": "${mul:${add:${model.dims.heads},${mul:2,${model.dims.kv}}},${model.dims.d}}",
        "b": "${add:1,2.5,-3}",
    }
    data, problems = _resolve(model)
    assert problems == {} and data["qkv"] == (4 + 2 * 2) * 16 and data["b"] == 0.5


@pytest.mark.parametrize("expression", ["${add:abc,1}", "${add:true,3}", "${add:1e308,1e308}"])
def test_add_takes_finite_numbers_only(expression: str) -> None:
    data, problems = _resolve({"a": expression})
    assert "a" not in data
    assert "add takes numbers" in problems["model.a"] or "not a finite number" in problems["model.a"]


def test_add_through_omegaconf_in_the_settings_too() -> None:
    from omegaconf import OmegaConf

    from te_assembly.config.interpolate import register_resolvers

    register_resolvers()
    assert OmegaConf.create({"a": 3, "b": "${add:${a},4}"}).b == 7


def test_a_missing_key_suggests_the_close_one() -> None:
    _, problems = _resolve({"dims": {"hidden": 8}, "a": "${model.dims.hiden}"})
    assert problems == {"model.a": "cannot resolve value: Interpolation key 'model.dims.hiden' not found"}


def test_a_cycle_is_reported_not_recursed_forever() -> None:
    _, problems = _resolve({"a": "${model.b}", "b": "${model.a}"})
    assert set(problems) == {"model.a", "model.b"}
    assert all("cycle" in m for m in problems.values())


def test_a_whole_subtree_reference_resolves_inside_it() -> None:
    data, problems = _resolve(
        {"dims": {"h": 4, "args": {"size": "${model.dims.h}"}}, "x": "${model.dims.args}"}
    )
    assert problems == {} and data["x"] == {"size": 4}


def test_other_interpolations_go_to_omegaconf() -> None:
    model = {"dims": {"h": 8}, "text": "width_${model.dims.h}", "seed_copy": "${seed}"}
    data, problems = _resolve(model, context={"seed": 5})
    assert problems == {}
    assert data["text"] == "width_8" and data["seed_copy"] == 5


@pytest.mark.parametrize(
    "text", ["${oc.env:TE_ASSEMBLY_TEST_WIDTH}", "tok_${oc.env:HOME}", "${oc.decode:'3'}"]
)
def test_resolvers_that_read_the_environment_are_refused_in_a_model(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A secret read into a channel name would be written into config.yaml, checkpoints and exports."""
    monkeypatch.setenv("TE_ASSEMBLY_TEST_WIDTH", "12")
    data, problems = _resolve({"a": text, "b": 1})
    assert data == {"b": 1}
    assert "is not allowed in a model file" in problems["model.a"]
    assert "12" not in problems["model.a"] and "/root" not in problems["model.a"]


def test_a_failing_fallback_is_one_diagnostic() -> None:
    data, problems = _resolve({"a": "width_${model.nope}", "b": 1})
    assert data == {"b": 1}
    assert "model.nope" in problems["model.a"]


def test_a_failed_list_item_keeps_the_list_length() -> None:
    data, problems = _resolve({"ops": ["${model.nope}", {"name": "a"}]})
    assert data["ops"] == [None, {"name": "a"}] and list(problems) == ["model.ops[0]"]


def test_settings_may_refer_to_the_model_and_to_each_other() -> None:
    from te_assembly.analysis.pipeline import load

    overrides = ["run.tokens='${mul:2,${model.dims.hidden}}'", "run.steps='${seed}'", "seed=4"]
    analysis = load("residual_mlp", [*overrides, "model.dims.hidden=16"])
    assert analysis.errors == []
    run = analysis.section("run")
    assert (run.tokens, run.steps) == (32, 4)


def test_a_doubling_string_is_refused_quickly_not_built() -> None:
    """``${a}${a}`` at every level doubles the string: refused once it would pass the limit, long before
    it fills memory (OmegaConf left to itself re-resolves the chain exponentially)."""
    from te_assembly.config.interpolate import MAX_STRING

    dims: dict[str, Any] = {"a0": "x"}
    for i in range(1, 40):
        dims[f"a{i}"] = f"${{model.dims.a{i - 1}}}${{model.dims.a{i - 1}}}"
    data, problems = _resolve({"dims": dims})
    limit = next(i for i in range(40) if 2**i > MAX_STRING)
    assert data["dims"][f"a{limit - 1}"] == "x" * 2 ** (limit - 1)
    assert "more than 2,000,000" in problems[f"model.dims.a{limit}"]
    assert set(problems) == {f"model.dims.a{i}" for i in range(limit, 40)}


def test_a_very_long_reference_chain_is_a_config_error() -> None:
    from te_assembly.config.interpolate import MAX_CHAIN

    dims: dict[str, Any] = {"a0": 8}
    for i in range(1, 5000):
        dims[f"a{i}"] = f"${{model.dims.a{i - 1}}}"
    _, problems = _resolve({"in_features": "${model.dims.a4999}", "dims": dims})
    assert f"a chain of more than {MAX_CHAIN} references" in problems["model.in_features"]
    # one line for the thousands of dims that fail alike, not one each
    (dims_line,) = [k for k in problems if k.startswith("model.dims.")]
    assert "more value(s) in chains this long fail alike" in problems[dims_line]
    short, fine = _resolve(
        {"x": "${model.dims.a3}", "dims": {k: v for k, v in dims.items() if int(k[1:]) < 4}}
    )
    assert fine == {} and short["x"] == 8
