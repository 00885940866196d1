"""The fusion report without TE: near misses with their changes and in-place safety, the targets,
validate's opt-in warnings and explain's table (TE's own passes are compared in tests/te/test_fusions.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import te_assembly
from te_assembly.analysis.fusions import FusionTarget, near_miss_warnings, predict

REPO_ROOT = Path(__file__).resolve().parents[2]


def _tap_then(op: dict[str, Any]) -> dict[str, Any]:
    """A residual tapped, then ``op``, then a Linear whose output adds the residual back."""
    return {
        "name": "tap_model",
        "in_features": 16,
        "ops": [
            {
                "name": "tap",
                "op": "MakeExtraOutput",
                "extra_outputs": {"out": {"channel": "r", "public": False}},
            },
            op,
            {"name": "fc", "op": "Linear", "args": {"in_features": 16, "out_features": 16}},
            {"name": "add", "op": "AddExtraInput", "extra_inputs": {"addend": "r"}},
        ],
    }


def _near(model: dict[str, Any], fusion: str, **target: Any) -> list[Any]:
    plan = te_assembly.load(model).checked_plan()
    found = predict(plan, FusionTarget.of(None, recipe=None, dtype="float32", env={}, **target))
    return [n for f in found for n in f.near_misses if n.fusion.name == fusion]


def _behind_a_linear(model: dict[str, Any]) -> dict[str, Any]:
    """The same model with a Linear first, so the tap is not the fuser's input."""
    pre = {"name": "pre", "op": "Linear", "args": {"in_features": 16, "out_features": 16}}
    return {**model, "ops": [pre, *model["ops"]]}


def test_an_in_place_add_is_safe_only_when_nothing_keeps_the_residual() -> None:
    scale = {"name": "scale", "op": "ConstantScale", "args": {"scale": 2.0}}
    (caller,) = _near(_tap_then(scale), "ForwardLinearBiasAdd")  # the tap's tensor is the caller's x
    assert caller.misses[0].safe is False and "the caller's x" in caller.misses[0].why
    (safe,) = _near(_behind_a_linear(_tap_then(scale)), "ForwardLinearBiasAdd")
    assert [(m.change, m.safe) for m in safe.misses] == [("add.args.in_place: true", True)]
    norm = {"name": "norm", "op": "RMSNorm", "args": {"normalized_shape": 16}}
    (unsafe,) = _near(_behind_a_linear(_tap_then(norm)), "ForwardLinearBiasAdd")
    (miss,) = unsafe.misses
    assert miss.safe is False and "norm (RMSNorm), which keeps it for backward" in miss.why


def test_backward_add_rmsnorm_needs_the_tap_out_of_place() -> None:
    model = _tap_then({"name": "norm", "op": "RMSNorm", "args": {"normalized_shape": 16}})
    model["ops"][0]["args"] = {"in_place": True}
    (near,) = _near(model, "BackwardAddRMSNorm")
    assert [(m.change, m.safe) for m in near.misses] == [("tap.args.in_place: false", True)]


def test_weight_dtype_recipe_gpu_and_tensor_parallel_conditions() -> None:
    dense = te_assembly.load("dense_transformer").checked_plan()
    fp32 = predict(dense, FusionTarget.of(None, recipe=None, dtype="float32", env={}))
    bf16 = predict(
        dense, FusionTarget.of(None, recipe={"kind": "Float8CurrentScaling"}, dtype="bfloat16", env={})
    )
    names = lambda found: {f.fusion.name for fuser in found for f in fuser.fired}  # noqa: E731
    assert names(fp32) == {"BackwardAddRMSNorm"}
    assert names(bf16) == {"BackwardAddRMSNorm", "ForwardLinearBiasActivation", "BackwardActivationBias"}
    moe = te_assembly.load("moe_transformer").checked_plan()
    env = {"NVTE_CUTEDSL_FUSED_GROUPED_MLP": "1"}

    def grouped(found: Any) -> list[Any]:
        return [
            n
            for f in found
            for n in f.near_misses
            if n.fusion.name == "GroupedMLP_CuTeGEMMGLU" and n.steps[0] == "layers.0.fc1"
        ]

    (cpu,) = grouped(predict(moe, FusionTarget.of(None, recipe=None, dtype="bfloat16", env={})))
    assert len(cpu.misses) == 4  # interleave, recipe, GPU generation, environment
    b200 = predict(
        moe, FusionTarget.of("b200", recipe={"kind": "MXFP8BlockScaling"}, dtype="bfloat16", env=env)
    )
    (left,) = grouped(b200)
    assert [m.condition for m in left.misses] == ["layers.0.act (ScaledSwiGLU) needs glu_interleave_size=32"]
    # no setting changes that one: not a warning
    assert not any("GroupedMLP" in d.message for d in near_miss_warnings(moe, b200))
    mlp = te_assembly.load("residual_mlp").checked_plan()  # fc2 is marked row-parallel
    single = [n for n in _near_plan(mlp, tensor_parallel=1) if n.fusion.name == "ForwardLinearBiasAdd"]
    split = [n for n in _near_plan(mlp, tensor_parallel=2) if n.fusion.name == "ForwardLinearBiasAdd"]
    assert not any("row-parallel" in m.condition for n in single for m in n.misses)
    assert any("row-parallel" in m.condition for n in split for m in n.misses)


def _near_plan(plan: Any, **target: Any) -> list[Any]:
    found = predict(plan, FusionTarget.of(None, recipe=None, dtype="float32", env={}, **target))
    return [n for f in found for n in f.near_misses]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb", "PYTHONPATH": str(REPO_ROOT)}
    env.pop("NVTE_CUTEDSL_FUSED_GROUPED_MLP", None)
    return subprocess.run(
        [sys.executable, "-m", "te_assembly", *args], capture_output=True, text=True, env=env
    )


def test_validate_warns_of_near_misses_only_when_asked() -> None:
    quiet = _cli("validate", "model=residual_mlp")
    assert quiet.returncode == 0 and "fusion-near-miss" not in quiet.stdout + quiet.stderr
    loud = _cli("validate", "model=residual_mlp", "fusions.warn=true")
    out = loud.stdout + loud.stderr
    assert loud.returncode == 0
    assert "residual_mlp.yaml:" in out and "ForwardLinearBiasAdd would fuse fc2, add_residual" in out
    assert "unsafe: channel 'residual' is the tensor the fuser was called with" in out
    bad = _cli("validate", "model=residual_mlp", "fusions.target=h1000")
    assert bad.returncode == 2 and "fusions.target" in bad.stdout + bad.stderr


def test_explain_shows_what_fires_per_fuser() -> None:
    done = _cli("explain", "model=dense_transformer", "dtype=bfloat16", "fusions.target=h100")
    assert done.returncode == 0, done.stderr
    table = done.stdout[done.stdout.index("TE fusions (for h100, bfloat16") :]
    assert "ForwardLinearBiasActivation" in table and "BackwardAddRMSNorm" in table and "fires" in table
    assert "layers[0-1].fc1" in table  # a block's uses share their rows
    reference = _cli("explain", "model=dense_transformer", "engine=te", "kernels=reference")
    assert "none fire: kernels=reference" in reference.stdout
