"""``explain``: basic-op indices, fusers, channels, call signature and parameter counts of the plan."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from te_assembly.analysis import analyze_resolved
from te_assembly.config import configs_dir
from te_assembly.config.resolved import resolve_text
from te_assembly.engines import build
from te_assembly.views.explain import signature

RunCli = Callable[..., subprocess.CompletedProcess[str]]

# Two fusers, a Linear (two TE basic ops) before each public input, public inputs in both fusers.
TWO_FUSERS = """
name: sig
in_features: 8
ops:
  - {name: a, op: AddExtraInput}
  - {name: lin, op: Linear, args: {in_features: 8, out_features: 8}}
  - {name: tap, op: MakeExtraOutput, extra_outputs: {out: {channel: t}}}
  - {name: b, op: AddExtraInput}
  - {name: cut, module: Identity}
  - {name: c, op: AddExtraInput}
  - {name: router, op: TopKRouter, args: {in_features: 8, num_experts: 4, top_k: 2},
     extra_outputs: {probs: {channel: p, public: false}, routing_map: {channel: m, public: false}}}
  - {name: d, op: Dispatch, args: {num_experts: 4, top_k: 2}, extra_inputs: {probs: p, routing_map: m}}
  - {name: back, op: Combine, args: {top_k: 2}}
"""


def test_signature_follows_te_order_across_fusers() -> None:
    plan = analyze_resolved(resolve_text(TWO_FUSERS)).checked_plan()
    # Inputs: (basic-op index, slot) within fuser 0, then fuser 1; Linear counts as two basic ops.
    assert [(t.name, t.fuser) for t in plan.public_inputs] == [
        ("a_addend", 0),
        ("b_addend", 0),
        ("c_addend", 1),
        ("back_row_map", 1),
    ]
    assert [s.first_basic_op for s in plan.steps if s.kind == "op"] == [0, 1, 3, 4, 0, 1, 2, 3]
    outputs = ["t", "router_aux_loss", "d_split_sizes", "d_row_probs", "d_row_map"]
    assert [t.name for t in plan.public_outputs] == outputs
    assert (
        signature(plan)
        == f"model(x, a_addend, b_addend, c_addend, back_row_map) -> (y, {', '.join(outputs)})"
    )


@pytest.mark.parametrize("model", ["two_stage", "moe_block", "residual_mlp"])
def test_explain_prints_plan(run_cli: RunCli, model: str) -> None:
    done = run_cli(["explain", f"model={model}"])
    assert done.returncode == 0, done.stderr
    out = done.stdout
    plan = analyze_resolved(resolve_text(_model_path(model).read_text())).checked_plan()
    for step in plan.steps:
        if step.kind == "module":
            assert re.search(rf"│ {step.index} │ {step.name}\s+│ {step.type}\s+│ -\s+│ \(module", out)
            continue
        first, n = step.first_basic_op, len(step.basic_ops)
        indices = f"{first}" if n == 1 else f"{first}-{first + n - 1}"
        basics = " + ".join(b for b, _ in step.basic_ops)
        row = rf"│ {step.index} │ {step.name}\s+│ {step.type}\s+│ {step.fuser}\s+│ "
        row += rf"{indices}: {re.escape(basics)}"
        assert re.search(row, out), row
        assert re.search(rf"│ {step.name}\s+│.*│\s+{step.num_params:,} │", out)
    for channel in plan.channels.values():
        producer = plan.steps[channel.producer.step]
        assert re.search(
            rf"│ {channel.name}\s+│ {channel.dtype}\s+│ {producer.name}\.{channel.producer.slot_name}", out
        )
    assert f"call signature: {signature(plan)}" in out
    # The total is the parameter count of the model the engines actually build.
    torch.manual_seed(0)
    built = build(plan, "reference")
    total = sum(p.numel() for p in built.parameters())
    assert plan.num_params == total
    assert re.search(rf"│\s+│ total\s+│.*│\s+{total:,} │", out)


def test_explain_of_an_invalid_model_exits_2_with_diagnostics(run_cli: RunCli) -> None:
    done = run_cli(["explain", "model=residual_mlp", "model.ops.2.args.in_features=7"])
    assert done.returncode == 2
    assert "model.ops[2].args.in_features" in done.stderr
    assert "Traceback" not in done.stderr


def _model_path(name: str) -> Path:
    return configs_dir() / "model" / f"{name}.yaml"
