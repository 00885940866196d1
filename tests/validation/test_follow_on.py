"""One mistake, one diagnostic: a broken step or slot must not also surface as a dangling channel, an
unused output, or the missing argument its own did-you-mean already names."""

from __future__ import annotations

import pytest

from te_assembly.analysis import analyze_resolved
from te_assembly.config.resolved import resolve_text
from tests.validation.test_invalid_corpus import BASE_YAML


@pytest.mark.parametrize(
    ("old", "new", "path", "code", "hint"),
    [
        ("op: Dispatch", "modul: Dispatch", "model.ops[3].modul", "unknown-key", "'module'"),
        ("op: Combine", "op: Combin", "model.ops[7].op", "unknown-op", "'Combine'"),
        (
            "extra_inputs: {scales: row_probs}",
            "extra_inputs: {scale: row_probs}",
            "model.ops[5].extra_inputs.scale",
            "unknown-slot",
            "'scales'",
        ),
        (
            "args: {normalized_shape: 8}",
            "args: {normalised_shape: 8}",
            "model.ops[1].args.normalised_shape",
            "unknown-arg",
            "'normalized_shape'",
        ),
    ],
)
def test_a_single_mistake_gives_a_single_diagnostic(
    old: str, new: str, path: str, code: str, hint: str
) -> None:
    assert old in BASE_YAML
    analysis = analyze_resolved(resolve_text(BASE_YAML.replace(old, new, 1)))
    diags, plan = analysis.diagnostics, analysis.plan
    assert plan is None
    assert [(d.path, d.code) for d in diags] == [(path, code)], [d.format() for d in diags]
    assert diags[0].hint is not None and hint in diags[0].hint


def test_a_channel_nobody_declares_is_still_dangling() -> None:
    diags = analyze_resolved(
        resolve_text(BASE_YAML.replace("{addend: residual}", "{addend: resid}"))
    ).diagnostics
    assert [(d.code, d.hint) for d in diags if d.is_error] == [("dangling-input", "did you mean 'residual'?")]


def test_a_name_with_two_producers_is_said_to_have_two() -> None:
    """Consumed after a module (a later fuser) where a second producer of the name follows it: the
    earlier producer exists, so 'no earlier producer' would be wrong."""
    from te_assembly.analysis.pipeline import load

    model = {
        "name": "two",
        "in_features": 8,
        "ops": [
            {
                "name": "tap1",
                "op": "MakeExtraOutput",
                "extra_outputs": {"out": {"channel": "r", "public": False}},
            },
            {"name": "drop", "module": "Dropout", "args": {"p": 0.0}},
            {"name": "add", "op": "AddExtraInput", "extra_inputs": {"addend": "r"}},
            {
                "name": "tap2",
                "op": "MakeExtraOutput",
                "extra_outputs": {"out": {"channel": "r", "public": False}},
            },
        ],
    }
    found = {d.code: d for d in load(model).diagnostics}
    consumer = found["producer-after-consumer"]
    assert consumer.path == "model.ops[2].extra_inputs.addend"
    assert "has 2 producers (step 'tap1' at model.ops[0], step 'tap2' at model.ops[3])" in consumer.message
    assert "no earlier producer" not in consumer.message
    assert found["duplicate-producer"].path == "model.ops[3].extra_outputs.out.channel"
