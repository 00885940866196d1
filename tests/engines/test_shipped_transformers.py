"""The shipped transformers (configs/model/moe_transformer.yaml and dense_transformer.yaml, from the
layer blocks in configs/block/): their structure as planned, that N layers are N single-layer models
applied in turn, state dicts across engines, and the hand-split variant of ``bench.compare`` against the
rerouted model, values and gradients, in both engines."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import te_assembly
from te_assembly.analysis.plan import Plan
from te_assembly.engines import build
from te_assembly.engines.base import loss_output_names
from te_assembly.engines.data import sample_x
from te_assembly.engines.target import Target
from te_assembly.jobs.bench import bench_loss, build_variants
from te_assembly.jobs.verify import state_dict_parameters

MODELS = {"moe_transformer": "moe_layer", "dense_transformer": "dense_layer"}
CPU = torch.device("cpu")


def _plan(model: str, layers: int) -> Plan:
    return te_assembly.load(model, overrides=[f"model.dims.layers={layers}"]).checked_plan()


def _x(plan: Plan, tokens: int = 48, seq_len: int = 8) -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    return sample_x(plan, tokens, generator=g, device=CPU, dtype=torch.float64, seq_len=seq_len)


@pytest.mark.parametrize("model", MODELS)
def test_layers_steps_fusers_and_reroutes(model: str) -> None:
    plan = _plan(model, 3)
    block = te_assembly.load(
        {
            "name": "one",
            "in_features": 64,
            "input_layout": "sequence",
            "ops": [{"name": "l", "block": MODELS[model]}],
        }
    ).checked_plan()
    per_layer = [s.name.split(".", 2)[2] for s in block.steps]
    assert [s.name for s in plan.steps] == [
        *(f"layers.{u}.{name}" for u in range(3) for name in per_layer),
        "final_norm",
        "head",
    ]
    assert plan.input_layout == "sequence"
    # Each layer's Attention ends a fuser; the residual around it is carried to the next fuser.
    assert len(plan.fusers) == 4
    names = {s.index: s.name for s in plan.steps}
    assert [
        (r.channel, r.producer_fuser, r.consumer_fusers, [names[m] for m in r.crosses]) for r in plan.reroutes
    ] == [(f"layers.{u}.attn_residual", u, (u + 1,), [f"layers.{u}.attn"]) for u in range(3)]
    assert not plan.public_inputs
    losses = [f"layers.{u}.aux_loss" for u in range(3)] if model == "moe_transformer" else []
    assert [t.name for t in plan.public_outputs] == losses
    assert list(loss_output_names(plan)) == losses


@pytest.mark.parametrize("model", MODELS)
def test_parameters_follow_the_layers(model: str) -> None:
    plan = _plan(model, 2)
    names = list(build(plan, "reference").state_dict())
    layer = {
        u: sorted(n.split(".", 3)[3] for n in names if n.startswith(f"steps.layers.{u}.")) for u in (0, 1)
    }
    assert layer[0] and layer[0] == layer[1]
    assert "attn_norm.weight" in layer[0] and "qkv.basic_ops.0.weight" in layer[0]
    if model == "moe_transformer":
        assert {f"fc2.bias{e}" for e in range(4)} <= set(layer[0])
    assert {n for n in names if not n.startswith("steps.layers.")} == {
        "steps.final_norm.weight",
        "steps.head.basic_ops.0.weight",
    }
    assert sum(p.numel() for p in build(plan, "reference").parameters()) == plan.num_params


def _one_layer(block: str) -> dict[str, Any]:
    return {
        "name": "one",
        "in_features": 64,
        "input_layout": "sequence",
        "ops": [{"name": "layers", "block": block}],
    }


@pytest.mark.parametrize("model", MODELS)
def test_two_layers_are_two_single_layer_models_in_turn(model: str) -> None:
    """Channels are scoped per use: the 2-layer model equals the layer applied twice with each layer's
    weights, then the final norm and projection; each layer's aux loss is its own."""
    plan = _plan(model, 2)
    torch.manual_seed(1)
    full = build(plan, Target.of("reference", dtype=torch.float64))
    # Random biases and norm weights, so that a mixed-up layer would show.
    with torch.no_grad():
        for p in full.parameters():
            p.add_(0.1 * torch.randn_like(p))
    state = full.state_dict()
    one = build(_one_layer(MODELS[model]), Target.of("reference", dtype=torch.float64))
    tail_plan = {
        "name": "tail",
        "in_features": 64,
        "ops": [
            {"name": "final_norm", "op": "RMSNorm", "args": {"normalized_shape": 64}},
            {"name": "head", "op": "Linear", "args": {"in_features": 64, "out_features": 64, "bias": False}},
        ],
    }
    tail = build(tail_plan, Target.of("reference", dtype=torch.float64))
    tail.load_state_dict({k: v for k, v in state.items() if not k.startswith("steps.layers.")})
    x = _x(plan)
    y, extras = full(x)
    h = x
    aux = []
    for u in range(2):
        prefix = f"steps.layers.{u}."
        one.load_state_dict(
            {"steps.layers.0." + k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        )
        h, one_extras = one(h)
        aux.append(one_extras.get("layers.0.aux_loss"))
    expected, _ = tail(h)
    torch.testing.assert_close(y, expected)
    if model == "moe_transformer":
        for u in range(2):
            torch.testing.assert_close(extras[f"layers.{u}.aux_loss"], aux[u])
        assert not torch.equal(extras["layers.0.aux_loss"], extras["layers.1.aux_loss"])


def _loss_and_grads(model: torch.nn.Module, plan: Plan, x: torch.Tensor) -> tuple[Any, dict[str, Any]]:
    x = x.detach().requires_grad_(True)
    out = model(x)
    bench_loss(out, loss_output_names(plan)).backward()
    grads: dict[str, Any] = {n: p.grad for n, p in state_dict_parameters(model).items()}
    grads["x"] = x.grad
    return out, grads


@pytest.mark.te
@pytest.mark.parametrize("model", MODELS)
def test_te_fusers_match_the_reference_engine_and_load_its_state_dict(model: str) -> None:
    plan = _plan(model, 2)
    torch.manual_seed(2)
    ref = build(plan, Target.of("reference", dtype=torch.float64))
    te = build(plan, Target.of("te", kernels="reference", dtype=torch.float64))
    # Every name matches; TE's ops add only their own _extra_state (quantization metadata).
    loaded = te.load_state_dict(ref.state_dict(), strict=False)
    assert not loaded.unexpected_keys and loaded.missing_keys
    assert all(k.endswith("._extra_state") for k in loaded.missing_keys)
    back = {k: v for k, v in te.state_dict().items() if not k.endswith("._extra_state")}
    build(plan, Target.of("reference", dtype=torch.float64)).load_state_dict(back)  # strict, the other way
    x = _x(plan)
    (ref_out, ref_grads), (te_out, te_grads) = (_loss_and_grads(m, plan, x) for m in (ref, te))
    torch.testing.assert_close(te_out.y, ref_out.y)
    assert list(te_out.extras) == list(ref_out.extras)
    for name, value in ref_out.extras.items():
        torch.testing.assert_close(te_out.extras[name], value)
    assert set(te_grads) == set(ref_grads)
    for name, g in ref_grads.items():
        assert g is not None and te_grads[name] is not None, name
        torch.testing.assert_close(te_grads[name], g, msg=name)
    # The rerouted residual's gradient reaches the first layer's norm through both paths.
    assert ref_grads["steps.layers.0.attn_norm.weight"].abs().sum() > 0


def _split_matches(engine: str, kernels: str, model: str) -> None:
    plan = _plan(model, 2)
    torch.manual_seed(4)
    variants, split = build_variants(
        plan,
        Target.of(engine, kernels=kernels, device=CPU, dtype=torch.float64),
        optimizer="sgd",
        lr=0.1,
        compare=True,
    )
    assert split is not None
    # One part per fuser: cut after each Attention, each rerouted residual passed by the caller.
    assert len(split.parts) == 3 and all(len(p.fusers) == 1 and not p.reroutes for p in split.parts)
    assert [b.channel for b in split.bridges] == [r.channel for r in plan.reroutes]
    assert [b.inputs for b in split.bridges] == [(f"layers.{u}.add_attn_addend",) for u in range(2)]
    x = _x(plan)
    (a_out, a_grads), (b_out, b_grads) = (_loss_and_grads(v.model, plan, x) for v in variants[:2])
    torch.testing.assert_close(b_out.y, a_out.y)
    for name, value in a_out.extras.items():
        torch.testing.assert_close(b_out.extras[name], value)
    by_step = {n.split(".", 2)[2] if n.startswith("parts.") else n: g for n, g in b_grads.items()}
    assert set(by_step) == set(a_grads)
    for name, g in a_grads.items():
        torch.testing.assert_close(by_step[name], g, msg=name)


@pytest.mark.parametrize("model", MODELS)
def test_hand_split_variant_matches_the_rerouted_model(model: str) -> None:
    _split_matches("reference", "te", model)


@pytest.mark.te
@pytest.mark.parametrize("model", MODELS)
def test_hand_split_variant_matches_the_rerouted_model_through_te_fusers(model: str) -> None:
    _split_matches("te", "reference", model)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 1), (8, 8), (6, 3)])
def test_the_packed_qkv_width_follows_the_heads(model: str, heads: int, kv_heads: int) -> None:
    """One dims override changes the attention's shape: the QKV width is computed in the block file."""
    plan = te_assembly.load(
        model, overrides=[f"model.dims.heads={heads}", f"model.dims.kv_heads={kv_heads}"]
    ).checked_plan()
    qkv = next(s for s in plan.steps if s.name == "layers.0.qkv")
    proj = next(s for s in plan.steps if s.name == "layers.0.proj")
    head_dim = plan.dims["head_dim"]
    assert qkv.out_width == (heads + 2 * kv_heads) * head_dim
    assert proj.in_width == heads * head_dim
    bad = te_assembly.load(model, overrides=["model.dims.heads=4", "model.dims.kv_heads=3"])
    assert bad.plan is None and any("kv_heads" in d.message for d in bad.diagnostics)
