"""The fusion prediction (``analysis/fusions.py``) against TE's own fusion passes.

TE decides its fusions from the op objects before any kernel runs, so on CPU the test constructs the
real TE ops of every fuser (te_assembly's own ops as the TE engine's adapters) and calls TE's passes the
way ``OperationFuser.maybe_fuse_ops`` does: the joint fusions, then the forward and the backward ones on
their result. Without a recipe: on CPU TE cannot build a recipe's quantizers, so the recipe-dependent
branches (BackwardActivationBias, the grouped-MLP fusions) and the compute capability are compared on a
GPU only (``test_fusions_fired_on_the_gpu_are_the_predicted_ones``; ``scripts/gpu_check.sh`` runs it).
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest
import torch

from te_assembly.analysis.fusions import FusionTarget, predict
from te_assembly.analysis.pipeline import load
from te_assembly.analysis.plan import Plan
from te_assembly.catalog.devices import ACCELERATORS
from te_assembly.config import available_models
from te_assembly.engines.target import Target

pytestmark = pytest.mark.te

Fused = set[tuple[str, tuple[int, ...]]]


def te_fusions(plan: Plan, dtype: torch.dtype) -> list[tuple[Fused, Fused]]:
    """Per fuser: TE's (forward, backward) fused ops with the basic-op indices each covers."""
    pytest.importorskip("transformer_engine.pytorch", reason="needs Transformer Engine")
    from transformer_engine.pytorch.ops.fuser import OperationFuser as F

    from te_assembly.engines.te.builder import _construct

    out = []
    for group in plan.fusers:
        basic: list[Any] = []
        for index in group.steps:
            op = _construct(plan.steps_by_index[index], "te", torch.device("cpu"), dtype)
            basic.extend(op.basic_ops if op.is_fused_op else [op])
        joint = F._apply_fusions(basic, F.forward_backward_fusion_functions, recipe=None)
        passes = []
        for funcs in (F.forward_fusion_functions, F.backward_fusion_functions):
            mapped = F._map_to_basic_ops(F._apply_fusions(joint, funcs, recipe=None), basic)
            passes.append({(type(op).__name__, tuple(idx)) for op, idx in mapped if op.is_fused_op})
        out.append((passes[0], passes[1]))
    return out


def predicted(plan: Plan, dtype: str) -> list[tuple[Fused, Fused]]:
    out = []
    for fuser in predict(plan, FusionTarget.of("cpu", recipe=None, dtype=dtype, env={})):
        joint = [f for f in fuser.forward if f.fusion.passes == "joint"]
        forward = {(f.fusion.name, tuple(op.index for op in f.ops)) for f in fuser.forward}
        backward = {(f.fusion.name, tuple(op.index for op in f.ops)) for f in (*joint, *fuser.backward)}
        out.append((forward, backward))
    return out


DTYPES = [(torch.float32, "float32"), (torch.bfloat16, "bfloat16")]


@pytest.mark.parametrize("model", available_models())
@pytest.mark.parametrize(("dtype", "name"), DTYPES)
def test_every_shipped_model_fuses_as_predicted(model: str, dtype: torch.dtype, name: str) -> None:
    plan = load(model).checked_plan()
    assert predicted(plan, name) == te_fusions(plan, dtype)


def random_chain(rng: random.Random, length: int) -> dict[str, Any]:
    """A valid single-fuser model of TE's basic ops, in-place flags at random: every extra slot public."""
    width = 16
    kinds: list[str] = []
    motifs = [
        ["BasicLinear", "ConstantScale", "AddExtraInput"],
        ["MakeExtraOutput", "BasicLinear"],
        ["MakeExtraOutput", "RMSNorm"],
        ["Linear", "AddExtraInput"],
    ]
    singles = [
        "BasicLinear",
        "Linear",
        "Bias",
        "AddExtraInput",
        "MakeExtraOutput",
        "RMSNorm",
        "ConstantScale",
    ]
    singles += ["GELU", "SiLU", "Identity", "LayerNorm"]
    while len(kinds) < length:
        if rng.random() < 0.25:  # a run some pattern starts with, so that every pattern is met
            kinds.extend(rng.choice(motifs))
        else:
            kinds.append(rng.choice(singles))
    ops: list[dict[str, Any]] = []
    for i, kind in enumerate(kinds):
        step: dict[str, Any] = {"name": f"s{i}", "op": kind}
        if kind in ("BasicLinear", "Linear"):
            step["args"] = {"in_features": width, "out_features": width}
            if kind == "Linear":
                step["args"]["bias"] = rng.random() < 0.5
        elif kind == "Bias":
            step["args"] = {"size": width}
        elif kind in ("RMSNorm", "LayerNorm"):
            step["args"] = {"normalized_shape": width}
        elif kind == "ConstantScale":
            step["args"] = {"scale": 0.5}
        elif kind in ("AddExtraInput", "MakeExtraOutput"):
            step["args"] = {"in_place": rng.random() < 0.5}
        ops.append(step)
    return {"name": "chain", "in_features": width, "ops": ops}


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize(("dtype", "name"), DTYPES)
def test_random_chains_fuse_as_predicted(seed: int, dtype: torch.dtype, name: str) -> None:
    rng = random.Random(seed)
    plan = load(random_chain(rng, rng.randint(2, 14)), sections={}).checked_plan()
    assert predicted(plan, name) == te_fusions(plan, dtype)


def test_the_chains_reach_every_pattern_a_cpu_can_check() -> None:
    """The random chains are worth something only if they exercise the patterns: each fusion that needs
    no recipe fires in some chain (float32 or bfloat16) and misses narrowly in another."""
    fired, missed = set(), set()
    for seed in range(40):
        rng = random.Random(seed)
        plan = load(random_chain(rng, rng.randint(2, 14)), sections={}).checked_plan()
        for dtype in ("float32", "bfloat16"):
            for fuser in predict(plan, FusionTarget.of("cpu", recipe=None, dtype=dtype, env={})):
                fired |= {f.fusion.name for f in fuser.fired}
                missed |= {n.fusion.name for n in fuser.near_misses}
    cpu_checkable = {
        "ForwardLinearBiasAdd",
        "ForwardLinearBiasActivation",
        "ForwardLinearScaleAdd",
        "BackwardLinearAdd",
        "BackwardLinearScale",
        "BackwardAddRMSNorm",
    }
    assert cpu_checkable <= fired
    assert {"ForwardLinearBiasAdd", "BackwardLinearAdd", "BackwardAddRMSNorm"} <= missed


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("model", "recipe"), [("dense_transformer", "fp8_current"), ("moe_transformer", "mxfp8")]
)
def test_fusions_fired_on_the_gpu_are_the_predicted_ones(model: str, recipe: str) -> None:
    """On a GPU, with a recipe: what TE's fusers recorded after a first forward equals the prediction
    for this GPU (its compute capability), recipe and environment."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("transformer_engine.pytorch", reason="needs Transformer Engine")
    import te_assembly
    from te_assembly.engines.te.recipe import check_recipe_on_current_device
    from te_assembly.errors import EngineUnavailableError, UnsupportedRecipeError

    analysis = te_assembly.load(model, [f"recipe={recipe}", "dtype=bfloat16"])
    plan = analysis.checked_plan()
    try:
        check_recipe_on_current_device(analysis.recipe)
    except (UnsupportedRecipeError, EngineUnavailableError) as exc:
        pytest.skip(f"{recipe} does not run on this GPU: {exc}")
    te_model = te_assembly.build(analysis, Target.of("te", device="cuda", dtype=torch.bfloat16))
    x, inputs = te_assembly.Target.of("te", device="cuda", dtype=torch.bfloat16).sample(
        plan, 64, torch.Generator().manual_seed(0), 16
    )
    te_model(x, **inputs).y.float().sum().backward()
    capability = torch.cuda.get_device_capability()
    name = next((k for k, v in ACCELERATORS.items() if v.capability == capability), "gpu")
    target = FusionTarget(name, capability, analysis.recipe["kind"], None, "bfloat16", env=dict(os.environ))
    for fuser, expected in zip(te_model.fusers, predict(plan, target), strict=True):
        forward = {(type(op).__name__, tuple(i)) for op, i in fuser._forward_ops if op.is_fused_op}
        backward = {(type(op).__name__, tuple(i)) for op, i in fuser._backward_ops if op.is_fused_op}
        joint = [f for f in expected.forward if f.fusion.passes == "joint"]
        assert forward == {(f.fusion.name, tuple(o.index for o in f.ops)) for f in expected.forward}
        assert backward == {
            (f.fusion.name, tuple(o.index for o in f.ops)) for f in (*joint, *expected.backward)
        }
