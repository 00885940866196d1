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
