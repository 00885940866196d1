"""Step fields the corpus cannot express as one broken rule: names that are valid, and null mappings."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from te_assembly.analysis.pipeline import load
from tests.validation.test_invalid_corpus import BASE


def _errors(model: dict[str, Any]) -> list[str]:
    analysis = load(model)
    diags, plan = analysis.diagnostics, analysis.plan
    errors = [d.format() for d in diags if d.is_error]
    assert (plan is None) == bool(errors)
    return errors


@pytest.mark.parametrize("name", ["naïve", "Überblick", "class", "steps", "_", "norm2"])
def test_any_python_identifier_is_a_step_name(name: str) -> None:
    # Keywords too: a step name is a dict key and a string in both engines, never Python syntax.
    model = copy.deepcopy(BASE)
    model["ops"][1]["name"] = name
    assert _errors(model) == []
    plan = load(model).plan
    assert plan is not None and plan.steps[1].name == name


@pytest.mark.parametrize(
    "name", ["pre-norm", "1norm", "norm two", "", "a..b", ".a", "a.", "3.a", "a.03", "a.b-c"]
)
def test_non_identifier_step_name_is_rejected(name: str) -> None:
    model = copy.deepcopy(BASE)
    model["ops"][1]["name"] = name
    analysis = load(model)
    assert analysis.plan is None
    assert [(d.path, d.code) for d in analysis.errors] == [("model.ops[1].name", "bad-name")]


@pytest.mark.parametrize("name", ["layers.3.norm", "a.b", "block.0.x_1"])
def test_dotted_step_names_nest_their_parameters(name: str) -> None:
    """What a block use expands to may also be written by hand: the same names, the same state dict."""
    from te_assembly.engines import build

    model = copy.deepcopy(BASE)
    model["ops"][1]["name"] = name
    assert _errors(model) == []
    built = build(model, "reference")
    assert f"steps.{name}.weight" in built.state_dict()


def test_a_step_name_cannot_be_the_scope_of_another() -> None:
    model = copy.deepcopy(BASE)
    model["ops"][1]["name"] = "fc1.inner"  # fc1 is model.ops[4]
    analysis = load(model)
    assert [(d.path, d.code) for d in analysis.errors] == [("model.ops[1].name", "step-name-scope")]
    assert "lies inside step 'fc1' (model.ops[4])" in analysis.errors[0].message


def test_null_args_and_slot_mappings_mean_empty() -> None:
    model = copy.deepcopy(BASE)
    model["ops"][5]["args"] = None  # ScaledSwiGLU has no arguments
    model["ops"][1]["extra_inputs"] = None  # RMSNorm: no slots
    model["ops"][1]["extra_outputs"] = None
    model["ops"][4]["extra_outputs"] = None  # GroupedLinear: no output slots
    assert _errors(model) == []
    plain = load(copy.deepcopy(BASE)).plan
    nulls = load(model).plan
    assert plain is not None and nulls is not None
    assert [(s.name, s.args, s.input_channels) for s in nulls.steps] == [
        (s.name, s.args, s.input_channels) for s in plain.steps
    ]


def test_null_args_still_need_required_arguments() -> None:
    model = copy.deepcopy(BASE)
    model["ops"][1]["args"] = None
    assert [(d.path, d.code) for d in load(model).errors] == [
        ("model.ops[1].args.normalized_shape", "missing-arg")
    ]


def test_hidden_channel_may_be_named_x() -> None:
    # Only public names reach the caller; a hidden channel's name stays inside the fuser.
    model = copy.deepcopy(BASE)
    model["ops"][0]["extra_outputs"]["out"]["channel"] = "x"
    model["ops"][8]["extra_inputs"]["addend"] = "x"
    assert _errors(model) == []
