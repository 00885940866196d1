"""Pass 3c, feature width along the main path: from ``model.in_features`` through each step's width rule.

Returns the steps with ``in_width``/``out_width``/``row_depth`` set (new objects) and the diagnostics.
"""

from __future__ import annotations

from collections.abc import Sequence

from te_assembly.analysis.plan import PlannedStep
from te_assembly.diagnostics import Diagnostic, error


def _width(value: object) -> int | None:
    """A usable width, or None: a non-positive one is reported where it is set, and suggesting it as a
    fix elsewhere (``set normalized_shape: -4``) would only spread the mistake."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def check_widths(
    steps: Sequence[PlannedStep | None], in_features: object
) -> tuple[list[PlannedStep | None], list[Diagnostic]]:
    """Check each step against the width arriving at it. ``model.in_features`` itself is checked by the
    schema; a bad one only stops the width checks."""
    out: list[Diagnostic] = []
    result: list[PlannedStep | None] = []
    width = _width(in_features)
    came_from = "model.in_features"
    depth: int | None = 0
    for step in steps:
        if step is None:
            width = depth = None  # unknown step: stop checking until a step sets the width again
            result.append(None)
            continue
        row_depth = depth
        delta = getattr(step.spec, "rows_delta", 0)
        depth = None if depth is None else depth + delta
        rule = step.spec.width
        if not step.args_valid:
            width = _width(rule.declared_out(step.args)) if rule.out_arg or rule.out_formula else None
            result.append(step.evolve(row_depth=row_depth))
            continue
        in_width = width
        if width is not None and rule.checks_input and rule.expected_in(step.args) != width:
            out.append(_width_mismatch(step, width, came_from))
        if width is not None and rule.divisor > 1 and width % rule.divisor:
            out.append(
                error(
                    f"model.ops[{step.index}].op",
                    "odd-glu-width",
                    f"{step.type} splits its input in {rule.divisor} parts but the width arriving is {width}",
                )
            )
        if rule.declared_out(step.args) is not None:
            width = rule.out_width(0, step.args)
        elif width is not None:
            width = rule.out_width(width, step.args)
        result.append(step.evolve(in_width=in_width, out_width=width, row_depth=row_depth))
        came_from = f"step {step.name!r} at model.ops[{step.index}]"
    return result, out


def _width_mismatch(step: PlannedStep, width: int, came_from: str) -> Diagnostic:
    rule = step.spec.width
    if rule.in_arg is not None:
        return error(
            f"model.ops[{step.index}].args.{rule.in_arg}",
            "width-mismatch",
            f"{step.type} step {step.name!r} has {rule.in_arg}={step.args.get(rule.in_arg)} but the "
            f"main path arrives with width {width} (from {came_from})",
            f"set {rule.in_arg}: {width}",
        )
    formula = rule.in_formula
    assert formula is not None
    return error(
        f"model.ops[{step.index}].args",
        "width-mismatch",
        f"{step.type} step {step.name!r} takes width {formula.text} = {formula.shown(step.args)} = "
        f"{formula.value(step.args)} but the main path arrives with width {width} (from {came_from})",
        f"choose {', '.join(formula.args)} so that {formula.text} = {width}, or change the width before it",
    )
