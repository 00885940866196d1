"""``model.*`` and ``recipe.*`` overrides applied to plain data with Hydra's rules (change, ``+`` add,
``++`` add or change, ``~`` delete), each failure one diagnostic with the keys that exist there."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from te_assembly.config.overrides import apply, held_back

MODEL: dict[str, Any] = {
    "name": "m",
    "dims": {"hidden": 8},
    "ops": [{"name": "a", "op": "Bias", "args": {"size": 8}}, {"name": "b", "op": "Identity"}],
}


def _apply(*lines: str) -> tuple[Any, list[tuple[str, str]]]:
    overrides = OverridesParser.create().parse_overrides(list(lines))
    before = copy.deepcopy(MODEL)
    result = apply(MODEL, overrides, "model")
    assert before == MODEL, "the input data must not change"
    return result.data, [(d.path, d.message) for d in result.diagnostics]


def test_change_add_force_add_delete() -> None:
    data, problems = _apply(
        "model.dims.hidden=16",
        "+model.description=hello",
        "++model.dims.ffn=32",
        "~model.ops.1",
        "model.ops.0.args={size: 4}",
    )
    assert problems == []
    assert data["dims"] == {"hidden": 16, "ffn": 32}
    assert data["description"] == "hello"
    assert [op["name"] for op in data["ops"]] == ["a"]
    assert data["ops"][0]["args"] == {"size": 4}


def test_a_mapping_value_merges_into_a_mapping() -> None:
    data, problems = _apply("model.dims={ffn: 16}")
    assert problems == [] and data["dims"] == {"hidden": 8, "ffn": 16}


def test_changing_a_missing_key_suggests_the_existing_one() -> None:
    _, problems = _apply("model.dims.hiden=3")
    [(path, message)] = problems
    assert path == "model.dims.hiden"
    assert "Could not override 'model.dims.hiden'" in message and "+model.dims.hiden=3" in message


@pytest.mark.parametrize(
    ("line", "path", "fragment"),
    [
        ("+model.name=x", "model.name", "an item is already at 'model.name'"),
        ("~model.nope", "model.nope", "does not exist"),
        ("~model.name=other", "model.name", "is 'm', not 'other'"),
        ("model.ops.5.name=x", "model.ops", "list index 5 is out of range (2 items)"),
        ("model.name.x=1", "model.name", "Could not override"),
    ],
)
def test_each_refused_override_is_one_diagnostic(line: str, path: str, fragment: str) -> None:
    _, problems = _apply(line)
    assert len(problems) == 1 and problems[0][0] == path and fragment in problems[0][1], problems


def test_only_value_overrides_below_a_file_group_are_held_back() -> None:
    parsed = OverridesParser.create().parse_overrides(
        ["model=moe_block", "model.dims.hidden=8", "~model.ops.3", "modelx.a=1", "recipe.margin=1", "seed=3"]
    )
    assert [held_back(o, ("model", "recipe")) for o in parsed] == [False, True, True, False, True, False]
