"""The invalid-config corpus: each case breaks one rule of a valid base model and names the diagnostic
that must come out (key path, rule code, message fragment, did-you-mean hint), with file and line."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from te_assembly.analysis import analyze_resolved
from te_assembly.analysis.pipeline import load
from te_assembly.config.resolved import read_source, resolve_text
from te_assembly.diagnostics import Diagnostic

# A small MoE block (moe_block.yaml with literal numbers): hidden 8, ffn 16, 4 experts, top 2.
BASE_YAML = """\
name: base
description: corpus base model
in_features: 8
dims: {hidden: 8}
ops:
  - name: residual
    op: MakeExtraOutput
    extra_outputs:
      out: {channel: residual, public: false}
  - name: norm
    op: RMSNorm
    args: {normalized_shape: 8}
  - name: router
    op: TopKRouter
    args: {in_features: 8, num_experts: 4, top_k: 2}
    extra_outputs:
      probs: {channel: probs, public: false}
      routing_map: {channel: routing_map, public: false}
      aux_loss: {channel: aux_loss, public: true}
  - name: dispatch
    op: Dispatch
    args: {num_experts: 4, top_k: 2}
    extra_inputs: {probs: probs, routing_map: routing_map}
    extra_outputs:
      split_sizes: {channel: split_sizes, public: false}
      row_probs: {channel: row_probs, public: false}
      row_map: {channel: row_map, public: false}
  - name: fc1
    op: GroupedLinear
    args: {num_groups: 4, in_features: 8, out_features: 32}
    extra_inputs: {split_sizes: split_sizes}
  - name: act
    op: ScaledSwiGLU
    extra_inputs: {scales: row_probs}
  - name: fc2
    op: GroupedLinear
    args: {num_groups: 4, in_features: 16, out_features: 8}
    extra_inputs: {split_sizes: split_sizes}
  - name: combine
    op: Combine
    args: {top_k: 2}
    extra_inputs: {row_map: row_map}
  - name: add_residual
    op: AddExtraInput
    extra_inputs: {addend: residual}
"""
BASE: dict[str, Any] = yaml.safe_load(BASE_YAML)

DELETE = object()
"""Patch value: remove the key."""

_STEP = re.compile(r"^ops\[(\d+)\](\+?)(.*)$")


def _apply(model: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """Apply ``{path: value}`` edits in order. ``ops[3]+`` inserts a step before index 3 (``ops[9]+``
    appends); other paths set (or with ``DELETE`` remove) one key, creating mappings on the way."""
    out = copy.deepcopy(model)
    for path, value in patch.items():
        m = _STEP.match(path)
        if m and m.group(2):
            out["ops"].insert(int(m.group(1)), copy.deepcopy(value))
            continue
        node: Any = out
        keys: list[Any] = []
        rest = path
        if m:
            node, rest = out["ops"][int(m.group(1))], m.group(3).lstrip(".")
        keys = rest.split(".") if rest else []
        if not keys:
            out["ops"][int(m.group(1))] = copy.deepcopy(value)  # type: ignore[union-attr]
            continue
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        if value is DELETE:
            del node[keys[-1]]
        else:
            node[keys[-1]] = copy.deepcopy(value)
    return out


@dataclass(frozen=True)
class Case:
    id: str
    patch: dict[str, Any]
    path: str
    code: str
    fragment: str
    hint: str | None = None
    """Expected did-you-mean target (the hint must contain it), or None when no hint is checked."""
    also: tuple[str, ...] = field(default=())
    """Other error codes this edit legitimately causes (any other error code fails the case)."""
    warning: bool = False


MOE = "model.ops"
CASES: list[Case] = [
    # --- the channel graph (TE's fuser rules, checked before any tensor exists) ---
    Case(
        "dangling-typo",
        {"ops[4].extra_inputs.split_sizes": "split_size"},
        f"{MOE}[4].extra_inputs.split_sizes",
        "dangling-input",
        "'split_size' consumed by step 'fc1' has no producer",
        hint="'split_sizes'",
    ),
    Case(
        "dangling-no-close-name",
        {"ops[8].extra_inputs.addend": "zzz"},
        f"{MOE}[8].extra_inputs.addend",
        "dangling-input",
        "'zzz'",
        hint="use null to make the input public",
    ),
    Case(
        "producer-after-consumer",
        {"ops[0]+": {"name": "early", "op": "AddExtraInput", "extra_inputs": {"addend": "residual"}}},
        f"{MOE}[0].extra_inputs.addend",
        "producer-after-consumer",
        "produced by step 'residual' at model.ops[1]",
    ),
    Case(
        "op-consumes-own-output",
        {"ops[3].extra_inputs.probs": "row_probs"},
        f"{MOE}[3].extra_inputs.probs",
        "producer-after-consumer",
        "has no earlier producer",
    ),
    Case(
        "duplicate-producer-two-ops",
        {
            "ops[1]+": {
                "name": "tap",
                "op": "MakeExtraOutput",
                "extra_outputs": {"out": {"channel": "residual"}},
            }
        },
        f"{MOE}[1].extra_outputs.out.channel",
        "duplicate-producer",
        "model.ops[0].extra_outputs.out.channel",
    ),
    Case(
        "duplicate-producer-two-slots",
        {"ops[2].extra_outputs.aux_loss": {"channel": "probs", "public": False}},
        f"{MOE}[2].extra_outputs.aux_loss.channel",
        "duplicate-producer",
        "'probs' already has a producer",
    ),
    Case(
        # A channel read across a module from a later fuser: no earlier producer (one read from an earlier
        # fuser is valid, carried across: tests/engines/test_reroute.py).
        "producer-in-later-fuser",
        {
            "ops[0]+": {"name": "early", "op": "AddExtraInput", "extra_inputs": {"addend": "residual"}},
            "ops[1]+": {"name": "split", "module": "Identity"},
        },
        f"{MOE}[0].extra_inputs.addend",
        "producer-after-consumer",
        "produced by step 'residual' at model.ops[2], in a later fuser (1)",
    ),
    Case(
        "channel-dtype-int-into-float",
        {"ops[8].extra_inputs.addend": "split_sizes"},
        f"{MOE}[8].extra_inputs.addend",
        "channel-dtype",
        "takes a float tensor but channel 'split_sizes' carries int",
    ),
    Case(
        "channel-dtype-float-into-int",
        {"ops[4].extra_inputs.split_sizes": "row_probs"},
        f"{MOE}[4].extra_inputs.split_sizes",
        "channel-dtype",
        "takes a int tensor but channel 'row_probs'",
    ),
    Case(
        "empty-input-channel",
        {"ops[4].extra_inputs.split_sizes": ""},
        f"{MOE}[4].extra_inputs.split_sizes",
        "bad-channel-name",
        "non-empty string or null, got ''",
    ),
    Case(
        "int-input-channel",
        {"ops[4].extra_inputs.split_sizes": 5},
        f"{MOE}[4].extra_inputs.split_sizes",
        "bad-channel-name",
        "got 5",
        also=("wrong-type",),
    ),
    Case(
        "empty-output-channel",
        {"ops[0].extra_outputs.out.channel": ""},
        f"{MOE}[0].extra_outputs.out.channel",
        "bad-channel-name",
        "got ''",
        also=("dangling-input",),
    ),
    Case(
        "list-output-channel",
        {"ops[0].extra_outputs.out.channel": ["residual"]},
        f"{MOE}[0].extra_outputs.out.channel",
        "bad-channel-name",
        "got ['residual']",
        also=("wrong-type", "dangling-input"),
    ),
    Case(
        "hidden-unnamed-output",
        {"ops[2].extra_outputs.aux_loss": {"public": False}},
        f"{MOE}[2].extra_outputs.aux_loss.public",
        "hidden-unnamed-output",
        "always returned to the caller",
    ),
    Case(
        "public-output-name-clash",
        {
            "ops[2].extra_outputs.aux_loss": DELETE,
            "ops[9]+": {
                "name": "tap",
                "op": "MakeExtraOutput",
                "extra_outputs": {"out": {"channel": "router_aux_loss"}},
            },
        },
        f"{MOE}[9]",
        "public-name-clash",
        "public output name 'router_aux_loss' is used twice",
    ),
    # --- argument agreement across a channel, feature widths ---
    Case(
        "num-groups-vs-num-experts",
        {"ops[4].args.num_groups": 3},
        f"{MOE}[4].args.num_groups",
        "channel-args-mismatch",
        "num_groups=3",
        hint="set num_groups: 4",
    ),
    Case(
        "top-k-disagreement",
        {"ops[7].args.top_k": 3},
        f"{MOE}[7].args.top_k",
        "channel-args-mismatch",
        "with top_k=2",
        hint="set top_k: 2",
    ),
    Case(
        "linear-in-features",
        {"ops[9]+": {"name": "proj", "op": "Linear", "args": {"in_features": 16, "out_features": 8}}},
        f"{MOE}[9].args.in_features",
        "width-mismatch",
        "arrives with width 8 (from step 'add_residual'",
        hint="set in_features: 8",
    ),
    Case(
        "grouped-in-features",
        {"ops[4].args.in_features": 9},
        f"{MOE}[4].args.in_features",
        "width-mismatch",
        "arrives with width 8",
        hint="set in_features: 8",
    ),
    Case(
        "glu-halves-width",
        {"ops[6].args.in_features": 32},
        f"{MOE}[6].args.in_features",
        "width-mismatch",
        "arrives with width 16 (from step 'act'",
        hint="set in_features: 16",
    ),
    Case(
        "odd-width-into-glu",
        {"ops[4].args.out_features": 33},
        f"{MOE}[5].op",
        "odd-glu-width",
        "width arriving is 33",
    ),
    Case(
        "norm-shape",
        {"ops[1].args.normalized_shape": 16},
        f"{MOE}[1].args.normalized_shape",
        "width-mismatch",
        "arrives with width 8 (from step 'residual'",
        hint="set normalized_shape: 8",
    ),
    # --- steps: op/module names, slots, arguments, names ---
    Case(
        "unknown-op-typo",
        {"ops[1].op": "RMSnorm"},
        f"{MOE}[1].op",
        "unknown-op",
        "unknown op 'RMSnorm'",
        hint="'RMSNorm'",
    ),
    Case(
        "module-name-as-op",
        {"ops[1].op": "Tanh"},
        f"{MOE}[1].op",
        "unknown-op",
        "unknown op 'Tanh'",
        hint="write 'module: Tanh'",
    ),
    Case(
        "unknown-module-typo",
        {"ops[9]+": {"name": "tail", "module": "Identiy"}},
        f"{MOE}[9].module",
        "unknown-module",
        "not in the allowlist",
        hint="'Identity'",
    ),
    Case(
        "module-with-slots",
        {"ops[9]+": {"name": "tail", "module": "Identity", "extra_inputs": {"x": "probs"}}},
        f"{MOE}[9].extra_inputs",
        "module-slots",
        "no extra tensor slots",
    ),
    Case(
        "op-and-module", {"ops[1].module": "Identity"}, f"{MOE}[1].op", "op-or-module", "exactly one of 'op'"
    ),
    Case(
        "neither-op-nor-module", {"ops[1].op": DELETE}, f"{MOE}[1].op", "op-or-module", "exactly one of 'op'"
    ),
    Case(
        "unknown-slot-typo",
        {"ops[4].extra_inputs": {"split_size": "split_sizes"}},
        f"{MOE}[4].extra_inputs.split_size",
        "unknown-slot",
        "no extra input slot 'split_size'",
        hint="'split_sizes'",
    ),
    Case(
        "unknown-output-slot",
        {"ops[2].extra_outputs.prob": {"channel": "p2"}},
        f"{MOE}[2].extra_outputs.prob",
        "unknown-slot",
        "its output slots: probs, routing_map, aux_loss",
        hint="'probs'",
    ),
    Case(
        "disabled-slot",
        {"ops[4].extra_inputs.scales": "row_probs"},
        f"{MOE}[4].extra_inputs.scales",
        "disabled-slot",
        "only when scale_bias=true and bias=true",
    ),
    Case(
        "unknown-arg-typo",
        {"ops[4].args.num_group": 4},
        f"{MOE}[4].args.num_group",
        "unknown-arg",
        "GroupedLinear has no argument 'num_group'",
        hint="'num_groups'",
    ),
    Case(
        "missing-arg",
        {"ops[4].args.num_groups": DELETE},
        f"{MOE}[4].args.num_groups",
        "missing-arg",
        "needs argument 'num_groups' (int)",
    ),
    Case(
        "string-for-int",
        {"ops[1].args.normalized_shape": "8"},
        f"{MOE}[1].args.normalized_shape",
        "wrong-type",
        "must be int, got str",
    ),
    Case(
        "bool-for-int",
        {"ops[2].args.top_k": True},
        f"{MOE}[2].args.top_k",
        "wrong-type",
        "must be int, got bool",
    ),
    Case(
        "bad-choice",
        {"ops[2].args.score_function": "softmx"},
        f"{MOE}[2].args.score_function",
        "bad-choice",
        "must be one of softmax, sigmoid",
        hint="'softmax'",
    ),
    Case(
        "non-positive-int",
        {"ops[3].args.num_experts": 0},
        f"{MOE}[3].args.num_experts",
        "out-of-range",
        "must be positive",
    ),
    Case(
        "duplicate-step-name",
        {"ops[6].name": "fc1"},
        f"{MOE}[6].name",
        "duplicate-name",
        "first used at model.ops[4]",
    ),
    Case(
        "bad-step-name",
        {"ops[1].name": "pre-norm"},
        f"{MOE}[1].name",
        "bad-name",
        "must be a Python identifier",
    ),
    # --- structure ---
    Case(
        "unknown-top-level-key",
        {"descripton": "typo"},
        "model.descripton",
        "unknown-key",
        "unknown key 'descripton'",
        hint="'description'",
    ),
    Case(
        "unknown-step-key",
        {"ops[4].extra_input": {"split_sizes": "split_sizes"}},
        f"{MOE}[4].extra_input",
        "unknown-key",
        "unknown key 'extra_input'",
        hint="'extra_inputs'",
    ),
    Case("empty-ops", {"ops": []}, f"{MOE}", "empty-model", "at least one step"),
    Case(
        "missing-in-features",
        {"in_features": DELETE},
        "model.in_features",
        "missing-key",
        "missing required key 'in_features'",
    ),
    Case("step-not-a-mapping", {"ops[1]": "RMSNorm"}, f"{MOE}[1]", "wrong-type", "got str"),
    # --- op/module that is not a name at all: one diagnostic, no crash ---
    Case("op-is-a-list", {"ops[1].op": ["RMSNorm"]}, f"{MOE}[1].op", "wrong-type", "got list (['RMSNorm'])"),
    Case("op-is-a-number", {"ops[1].op": 5}, f"{MOE}[1].op", "wrong-type", "op must be str, got int (5)"),
    Case(
        "module-is-a-mapping",
        {"ops[9]+": {"name": "tail", "module": {"name": "Identity"}}},
        f"{MOE}[9].module",
        "wrong-type",
        "got dict",
    ),
    # --- argument values TE or torch would reject at build time ---
    Case(
        "top-k-above-num-experts",
        {"ops[2].args.top_k": 5, "ops[3].args.top_k": 5, "ops[7].args.top_k": 5},
        f"{MOE}[2].args.top_k",
        "arg-order",
        "TopKRouter needs top_k <= num_experts, got top_k=5 and num_experts=4",
        hint="at most 4",
    ),
    Case(
        "dispatch-top-k-above-num-experts",
        {"ops[3].args.top_k": 6, "ops[3].args.num_experts": 5, "ops[2].args.num_experts": 5},
        f"{MOE}[3].args.top_k",
        "arg-order",
        "Dispatch needs top_k <= num_experts, got top_k=6 and num_experts=5",
        also=("channel-args-mismatch",),
    ),
    Case(
        "dropout-op-p-above-one",
        {"ops[9]+": {"name": "drop", "op": "Dropout", "args": {"p": 1.5}}},
        f"{MOE}[9].args.p",
        "out-of-range",
        "p must be between 0.0 and 1.0, got 1.5",
    ),
    Case(
        "dropout-module-p-negative",
        {"ops[9]+": {"name": "drop", "module": "Dropout", "args": {"p": -0.1}}},
        f"{MOE}[9].args.p",
        "out-of-range",
        "p must be between 0.0 and 1.0, got -0.1",
    ),
    Case(
        "in-features-negative", {"in_features": -4}, "model.in_features", "out-of-range", "must be positive"
    ),
    Case("in-features-zero", {"in_features": 0}, "model.in_features", "out-of-range", "got 0"),
    # --- what a channel carries: its shape, and for main-path tensors the width ---
    Case(
        "channel-shape-probs-into-scales",
        {"ops[5].extra_inputs.scales": "probs"},
        f"{MOE}[5].extra_inputs.scales",
        "channel-shape",
        "takes one value per row (rows) but channel 'probs' carries a [tokens, top_k] tensor",
    ),
    Case(
        "channel-shape-loss-into-addend",
        {"ops[8].extra_inputs.addend": "aux_loss"},
        f"{MOE}[8].extra_inputs.addend",
        "channel-shape",
        "channel 'aux_loss' carries a scalar (TopKRouter.aux_loss: scalar)",
    ),
    Case(
        "channel-shape-row-map-into-split-sizes",
        {"ops[6].extra_inputs.split_sizes": "row_map"},
        f"{MOE}[6].extra_inputs.split_sizes",
        "channel-shape",
        "takes one value per group (groups)",
    ),
    Case(
        "channel-rows-token-residual-on-expert-rows",
        {"ops[7]+": {"name": "early_add", "op": "AddExtraInput", "extra_inputs": {"addend": "residual"}}},
        f"{MOE}[7].extra_inputs.addend",
        "channel-rows",
        "carries token rows (from step 'residual') but step 'early_add' runs on dispatched expert rows",
        hint="same side of Dispatch/Combine",
    ),
    Case(
        "channel-rows-row-probs-after-combine",
        {"ops[9]+": {"name": "late", "op": "ScaledSwiGLU", "extra_inputs": {"scales": "row_probs"}}},
        f"{MOE}[9].extra_inputs.scales",
        "channel-rows",
        "carries dispatched expert rows (from step 'dispatch') but step 'late' runs on token rows",
    ),
    Case(
        "channel-width-residual-after-linear",
        {"ops[8]+": {"name": "up", "op": "Linear", "args": {"in_features": 8, "out_features": 16}}},
        f"{MOE}[9].extra_inputs.addend",
        "channel-width",
        "channel 'residual' has width 8 (the main path at step 'residual', model.ops[0]) but the main path "
        "arrives at step 'add_residual' (model.ops[9]) with width 16",
    ),
    # --- names: x and y are the main tensors ---
    Case(
        "public-channel-named-x",
        {"ops[2].extra_outputs.aux_loss": {"channel": "x"}},
        f"{MOE}[2].extra_outputs.aux_loss.channel",
        "reserved-name",
        "public output name 'x' is reserved",
    ),
    Case(
        "public-channel-named-y",
        {"ops[0].extra_outputs.out": {"channel": "y"}, "ops[8].extra_inputs.addend": "y"},
        f"{MOE}[0].extra_outputs.out.channel",
        "reserved-name",
        "it names the main output tensor",
    ),
    Case(
        "extra-input-from-x",
        {"ops[8].extra_inputs.addend": "x"},
        f"{MOE}[8].extra_inputs.addend",
        "reserved-name",
        "'x' is the main input tensor, not a channel",
        hint="MakeExtraOutput",
    ),
    Case(
        "step-name-starts-with-digit",
        {"ops[1].name": "1norm"},
        f"{MOE}[1].name",
        "bad-name",
        "must be a Python identifier",
    ),
    # --- warnings: valid configs, but worth a word ---
    Case(
        "unused-hidden-output",
        {"ops[8].extra_inputs.addend": None},
        f"{MOE}[0].extra_outputs.out.channel",
        "unused-hidden-output",
        "'residual' has no consumer",
        warning=True,
    ),
    Case(
        "hidden-loss-unused",
        {"ops[2].extra_outputs.aux_loss": {"channel": "aux_loss", "public": False}},
        f"{MOE}[2].extra_outputs.aux_loss.channel",
        "unused-hidden-output",
        "'aux_loss' has no consumer",
        hint="it is a loss term: make it public",
        warning=True,
    ),
    Case(
        "in-place-endpoint",
        {"ops[8].args.in_place": True},
        f"{MOE}[8].args.in_place",
        "in-place-endpoint",
        "silently overwrite",
        warning=True,
    ),
]


def _load(patch: Mapping[str, Any], file: str) -> tuple[str, list[Diagnostic], bool]:
    text = yaml.safe_dump(_apply(BASE, patch), sort_keys=False)
    analysis = analyze_resolved(resolve_text(text, file))
    return text, list(analysis.diagnostics), analysis.plan is not None


def test_base_model_is_valid() -> None:
    _, diags, planned = _load({}, "base.yaml")
    assert [d.format() for d in diags] == []
    assert planned


def test_corpus_covers_every_rule() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)) >= 30
    assert len({c.code for c in CASES}) >= 25


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_invalid_config(case: Case) -> None:
    text, diags, planned = _load(case.patch, f"{case.id}.yaml")
    shown = "\n".join(d.format() for d in diags)
    match = [d for d in diags if d.path == case.path and d.code == case.code]
    assert match, f"expected {case.code} at {case.path}; got:\n{shown}"
    d = match[0]
    assert case.fragment in d.message, shown
    assert d.is_error is not case.warning
    if case.hint is not None:
        assert d.hint is not None and case.hint in d.hint, shown
    # Nothing unrelated: every error comes from this case's edit.
    allowed = {case.code, *case.also}
    assert {e.code for e in diags if e.is_error} <= allowed, shown
    assert planned is case.warning
    # Located in the file: the line holds the offending key (or the nearest enclosing key the YAML names).
    assert d.file == f"{case.id}.yaml"
    assert d.line is not None
    line = text.splitlines()[d.line - 1]
    last = _deepest_present(yaml.safe_load(text), case.path)
    if last is None:
        assert d.line == 1
    elif isinstance(last, int):
        assert line.lstrip().startswith("- "), f"line {d.line} is not a list item: {line!r}"
    else:
        assert line.lstrip(" -").startswith(f"{last}:"), f"line {d.line} does not name {last!r}: {line!r}"


def _deepest_present(data: Any, path: str) -> str | int | None:
    """The last component of ``path`` (below ``model``) that exists in ``data``; None for the root."""
    found: str | int | None = None
    node = data
    for index, key in re.findall(r"\[(\d+)\]|\.([^.\[]+)", path):
        step: str | int = int(index) if index else key
        if isinstance(step, int) and isinstance(node, list) and step < len(node):
            node = node[step]
        elif isinstance(step, str) and isinstance(node, dict) and step in node:
            node = node[step]
        else:
            break
        found = step
    return found


# Six independent errors; each offending line carries a marker comment naming the rule it breaks.
MULTI_YAML = """\
name: multi
in_features: 8
descripton: several mistakes at once     # E unknown-key
ops:
  - name: residual
    op: MakeExtraOutput
    extra_outputs:
      out: {channel: residual, public: false}
  - name: pre-norm                       # E bad-name
    op: RMSNorm
    args:
      normalized_shape: 8
      epsilon: 1.0e-6                    # E unknown-arg
  - name: up
    op: Linear
    args: {in_features: 8, out_features: 32}
  - name: act
    op: SwiGLU
  - name: down
    op: Linear
    args:
      in_features: 32                    # E width-mismatch
      out_features: 8
  - name: scale
    op: ConstantScale
    args:
      scale: fast                        # E wrong-type
  - name: add
    op: AddExtraInput
    extra_inputs: {addend: residul}      # E dangling-input
"""


def _marked(text: str) -> list[tuple[int, str]]:
    return [
        (number, line.split("# E ")[1].strip())
        for number, line in enumerate(text.splitlines(), start=1)
        if "# E " in line
    ]


def test_every_error_at_once_in_file_order(tmp_path: Path) -> None:
    path = tmp_path / "multi.yaml"
    path.write_text(MULTI_YAML)
    assert read_source(str(path), "model").diagnostics == ()
    analysis = load(path)
    diags = analysis.diagnostics
    assert analysis.plan is None
    assert sorted(d.code for d in diags if d.is_error) == sorted(code for _, code in _marked(MULTI_YAML))
    located = diags
    assert all(d.file == str(path) for d in located)
    assert [(d.line, d.code) for d in located if d.is_error] == _marked(MULTI_YAML)
    dangling = next(d for d in located if d.code == "dangling-input")
    assert dangling.hint is not None and "'residual'" in dangling.hint


YAML_SYNTAX_CASES = [
    ("bad-indent", "name: x\nin_features: 8\nops:\n  - name: a\n    op: Bias\n   args: {size: 8}\n", 6),
    ("unclosed-flow", "name: x\nin_features: 8\nops:\n  - {name: a, op: Bias\n", 5),
    ("tab-indent", "name: x\nin_features: 8\nops:\n\t- name: a\n", 4),
]


@pytest.mark.parametrize(
    ("text", "line"), [c[1:] for c in YAML_SYNTAX_CASES], ids=[c[0] for c in YAML_SYNTAX_CASES]
)
def test_yaml_syntax_error_has_file_and_line(text: str, line: int) -> None:
    analysis = analyze_resolved(resolve_text(text, "broken.yaml"))
    assert [(d.code, d.file, d.line) for d in analysis.diagnostics] == [("yaml-syntax", "broken.yaml", line)]
    assert "YAML syntax error" in analysis.diagnostics[0].message


def test_bad_interpolation_is_reported_with_its_path() -> None:
    text = BASE_YAML.replace("args: {normalized_shape: 8}", "args: {normalized_shape: '${model.dims.nope}'}")
    assert text != BASE_YAML
    resolved = resolve_text(text, "interp.yaml")
    bad = [d for d in resolved.diagnostics if d.code == "bad-interpolation"]
    assert [d.path for d in bad] == ["model.ops[1].args.normalized_shape"]
    assert "nope" in bad[0].message
    assert bad[0].file == "interp.yaml"
    assert "normalized_shape" in text.splitlines()[bad[0].line - 1]
