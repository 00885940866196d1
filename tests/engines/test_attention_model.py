"""Attention and token views in built models, both engines (the TE engine with ``kernels=reference``:
TE's real ``OperationFuser`` on CPU, in the ``te`` tier): a pre-norm attention sublayer against the
same layer written by hand (naive attention, float64), forward and every gradient; token views on
inputs of any rank; the decoder layer used by the CLI tests (tests/configs/model/attention_layer.yaml),
TE engine against reference engine; call checks, synthetic data, FLOPs and memory."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from te_assembly import build, load
from te_assembly.analysis.plan import Plan
from te_assembly.analysis.settings import RunSettings
from te_assembly.engines.base import AssembledModel, InputShapeError
from te_assembly.engines.data import sample_public_inputs, sample_x, x_lead
from te_assembly.engines.memory import activation_bytes, attention_elements, check_fits, estimate
from te_assembly.engines.reference.attention import Attention, twice_differentiable
from te_assembly.engines.target import Target
from te_assembly.errors import ResourceError
from te_assembly.jobs.bench.flops import attention_flops, forward_flops
from tests.engines._helpers import randomize
from tests.reference.naive_attention import naive_attention

F64 = torch.float64
LAYER = Path(__file__).resolve().parents[1] / "configs" / "model" / "attention_layer.yaml"
HIDDEN, HEADS, KV, HEAD_DIM = 16, 4, 2, 4

ENGINES = [
    pytest.param(("reference", "te"), id="reference"),
    pytest.param(("te", "reference"), id="te-kernels-reference", marks=pytest.mark.te),
]

SUBLAYER: dict[str, Any] = {
    "name": "attn_sublayer",
    "in_features": HIDDEN,
    "input_layout": "sequence",
    "ops": [
        {"name": "residual", "op": "MakeExtraOutput", "extra_outputs": {"out": {"channel": "residual"}}},
        {"name": "norm", "op": "RMSNorm", "args": {"normalized_shape": HIDDEN}},
        {
            "name": "qkv",
            "op": "Linear",
            "args": {"in_features": HIDDEN, "out_features": (HEADS + 2 * KV) * HEAD_DIM},
        },
        {
            "name": "attn",
            "module": "Attention",
            "args": {
                "num_heads": HEADS,
                "num_kv_heads": KV,
                "head_dim": HEAD_DIM,
                "rotary": True,
                "rotary_base": 50.0,
            },
        },
        {"name": "proj", "op": "Linear", "args": {"in_features": HEADS * HEAD_DIM, "out_features": HIDDEN}},
        {"name": "add", "op": "AddExtraInput", "extra_inputs": {"addend": None}},  # public: the caller's x
    ],
}


def _build(
    config: Plan | dict[str, Any] | Path, engine: tuple[str, str], dtype: torch.dtype = F64
) -> AssembledModel:
    torch.manual_seed(0)
    plan = config if isinstance(config, Plan) else load(config).checked_plan()
    return build(plan, Target.of(engine[0], kernels=engine[1], dtype=dtype))


def _by_hand(x: torch.Tensor, addend: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
    """The sublayer from its definition: addend + proj(attention(qkv(rmsnorm(x))))."""
    h = x / torch.sqrt(x.square().mean(-1, keepdim=True) + 1e-5) * params["steps.norm.weight"]
    qkv = h @ params["steps.qkv.basic_ops.0.weight"].T + params["steps.qkv.basic_ops.1.bias"]
    a = naive_attention(qkv, HEADS, KV, HEAD_DIM, rotary=True, base=50.0)
    return addend + a @ params["steps.proj.basic_ops.0.weight"].T + params["steps.proj.basic_ops.1.bias"]


@pytest.mark.parametrize("engine", ENGINES)
def test_attention_sublayer_matches_the_layer_written_by_hand(engine: tuple[str, str]) -> None:
    model = _build(SUBLAYER, engine)
    randomize(model)
    assert model.input_names == ["add_addend"] and model.output_names == ["residual"]
    x = torch.randn(2, 5, HIDDEN, generator=torch.Generator().manual_seed(3), dtype=F64, requires_grad=True)
    y, extras = model(x, add_addend=x)  # the residual around attention, passed by the caller
    params = {
        k: v.detach().clone().requires_grad_(True)
        for k, v in model.state_dict().items()
        if v.is_floating_point()
    }
    x_hand = x.detach().clone().requires_grad_(True)
    want = _by_hand(x_hand, x_hand, params)
    torch.testing.assert_close(y, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(extras["residual"], x, rtol=0, atol=0)
    cotangent = torch.randn(y.shape, generator=torch.Generator().manual_seed(4), dtype=F64)
    (y * cotangent).sum().backward()
    (want * cotangent).sum().backward()
    assert x.grad is not None and x_hand.grad is not None
    torch.testing.assert_close(x.grad, x_hand.grad, rtol=1e-10, atol=1e-10)
    named = dict(model.named_parameters())
    grads = {k: named[k].grad for k in params if k in named}
    assert set(grads) == {k for k in params if not k.endswith("_extra_state")}
    for name, grad in grads.items():
        assert grad is not None, name
        torch.testing.assert_close(grad, params[name].grad, rtol=1e-10, atol=1e-10, msg=name)


@pytest.mark.parametrize("engine", ENGINES)
def test_token_views_flatten_and_restore_any_rank(engine: tuple[str, str]) -> None:
    config = {
        "name": "views",
        "in_features": 6,
        "ops": [
            {
                "name": "flatten",
                "op": "FlattenTokens",
                "extra_outputs": {"token_shape": {"channel": "shape", "public": False}},
            },
            {"name": "lin", "op": "Linear", "args": {"in_features": 6, "out_features": 3}},
            {"name": "restore", "op": "RestoreTokens", "extra_inputs": {"token_shape": "shape"}},
        ],
    }
    model = _build(config, engine)
    randomize(model)
    weight, bias = (
        model.state_dict()["steps.lin.basic_ops.0.weight"],
        model.state_dict()["steps.lin.basic_ops.1.bias"],
    )
    for shape in ((7, 6), (2, 3, 6), (2, 1, 4, 6), (6,)):
        x = torch.randn(shape, dtype=F64, requires_grad=True)
        y, _ = model(x)
        assert y.shape == (*shape[:-1], 3)
        torch.testing.assert_close(y, x @ weight.T + bias)
        y.sum().backward()
        assert x.grad is not None
        torch.testing.assert_close(x.grad, weight.sum(0).expand(shape))


@pytest.mark.te
def test_decoder_layer_te_engine_matches_reference_engine() -> None:
    from te_assembly.jobs.verify import verify

    plan = load(LAYER).checked_plan()
    report = verify(plan, Target.of("te", kernels="reference", dtype=F64), RunSettings(tokens=48, seq_len=12))
    assert report.passed, [(c.name, c.max_abs) for c in report.failures]
    names = {c.name for c in report.comparisons}
    assert {
        "y",
        "residual",
        "aux_loss",
        "grad x",
        "grad add_attn_addend",
        "grad steps.qkv.basic_ops.0.weight",
    } <= names


def test_decoder_layer_runs_in_the_reference_engine_and_keeps_x_shape() -> None:
    model = _build(LAYER, ("reference", "te"), dtype=torch.float32)
    x = torch.randn(3, 8, model.plan.in_features, requires_grad=True)
    y, extras = model(x, add_attn_addend=x)
    assert y.shape == x.shape and extras["residual"].shape == x.shape and extras["aux_loss"].dim() == 0
    (y.square().mean() + extras["aux_loss"]).backward()
    assert x.grad is not None and bool(x.grad.abs().sum() > 0)
    assert all(p.grad is not None for p in model.parameters())


def test_a_sequence_model_checks_x_and_its_public_inputs() -> None:
    model = _build(SUBLAYER, ("reference", "te"))
    with pytest.raises(
        InputShapeError,
        match=r"takes x as a 3-D \[batch, seq, features\] tensor \(from input_layout: sequence\)",
    ):
        model(torch.randn(10, HIDDEN, dtype=F64), add_addend=torch.randn(10, HIDDEN, dtype=F64))
    x = torch.randn(2, 5, HIDDEN, dtype=F64)
    with pytest.raises(InputShapeError, match=r"must have shape \[2, 5, 16\]"):
        model(x, add_addend=torch.randn(10, HIDDEN, dtype=F64))


def test_a_public_addend_after_flatten_takes_token_rows() -> None:
    config = {
        "name": "flat_addend",
        "in_features": 4,
        "ops": [
            {
                "name": "flatten",
                "op": "FlattenTokens",
                "extra_outputs": {"token_shape": {"channel": "s", "public": False}},
            },
            {"name": "add", "op": "AddExtraInput"},
            {"name": "restore", "op": "RestoreTokens", "extra_inputs": {"token_shape": "s"}},
        ],
    }
    model = _build(config, ("reference", "te"))
    x = torch.randn(2, 3, 4, dtype=F64)
    y, _ = model(x, add_addend=torch.ones(6, 4, dtype=F64))
    torch.testing.assert_close(y, x + 1)
    with pytest.raises(InputShapeError, match=r"must have shape \[6, 4\]"):
        model(x, add_addend=torch.ones(2, 3, 4, dtype=F64))
    inputs = sample_public_inputs(
        model.plan, 6, generator=torch.Generator().manual_seed(0), device=torch.device("cpu"), dtype=F64
    )
    assert inputs["add_addend"].shape == (6, 4)


def test_synthetic_data_comes_in_whole_sequences() -> None:
    plan = load(SUBLAYER).checked_plan()
    generator = torch.Generator().manual_seed(0)
    cpu = torch.device("cpu")
    x = sample_x(plan, 96, generator=generator, device=cpu, dtype=F64, seq_len=24)
    assert x.shape == (4, 24, HIDDEN)
    inputs = sample_public_inputs(plan, 96, generator=generator, device=cpu, dtype=F64, seq_len=24)
    assert inputs["add_addend"].shape == (4, 24, HIDDEN)
    with pytest.raises(ValueError, match="not whole sequences of 24 positions"):
        x_lead(plan, 100, 24)
    assert x_lead(load("residual_mlp").checked_plan(), 100, 24) == (100,)


def test_restore_samples_a_public_token_shape_of_x() -> None:
    mapping = copy.deepcopy(load(LAYER).resolved.model)
    restore = next(op for op in mapping["ops"] if op["name"] == "restore")
    restore["extra_inputs"] = {"token_shape": None}
    plan = load(mapping).checked_plan()
    inputs = sample_public_inputs(
        plan,
        64,
        generator=torch.Generator().manual_seed(0),
        device=torch.device("cpu"),
        dtype=F64,
        seq_len=16,
    )
    assert inputs["restore_token_shape"].tolist() == [4, 16]
    assert inputs["restore_token_shape"].dtype == torch.int64


def test_attention_flops_count_what_torch_counts() -> None:
    """Independent check of the formula: torch's FlopCounterMode on the reference module counts every
    (query, key) pair; causal attention computes s (s + 1) / 2 of the s * s per sequence. Counted on the
    math backend (``twice_differentiable``), whose matmuls torch sees; the flash kernel is one opaque op."""
    args = {"num_heads": 4, "num_kv_heads": 2, "head_dim": 8}
    x = torch.randn(3, 16, (4 + 2 * 2) * 8)
    with FlopCounterMode(display=False) as counter, twice_differentiable():
        Attention(4, 8, 2, causal=False)(x)
    assert attention_flops({**args, "causal": False}, rows=48, seq_len=16) == counter.get_total_flops()
    causal = attention_flops({**args, "causal": True}, rows=48, seq_len=16)
    assert causal * 2 * 16 == counter.get_total_flops() * 17
    plan = load(SUBLAYER).checked_plan()
    linears = 2 * 48 * HIDDEN * (HEADS + 2 * KV) * HEAD_DIM + 2 * 48 * HEADS * HEAD_DIM * HIDDEN
    attention = 4 * 3 * HEADS * HEAD_DIM * (16 * 17 // 2)
    assert forward_flops(plan, 48, seq_len=16) == linears + attention


def test_memory_estimate_counts_attention_and_refuses_what_cannot_fit() -> None:
    plan = load(SUBLAYER).checked_plan()
    without = activation_bytes(load({**SUBLAYER, "ops": SUBLAYER["ops"][:3]}).checked_plan(), 64, F64)
    short, long = activation_bytes(plan, 64, F64, seq_len=8), activation_bytes(plan, 64, F64, seq_len=64)
    # the probabilities grow with the sequence: heads * (seq_len) per row, 8 bytes each in float64
    assert long - short == 64 * HEADS * (64 - 8) * 8
    assert short > without
    assert attention_elements({"num_heads": HEADS, "head_dim": HEAD_DIM}, 64, 8, fused=True) == 64 * HEADS * (
        3 * HEAD_DIM + 1
    )
    # a sequence whose attention probabilities cannot fit is refused before anything is allocated
    needed = estimate(plan, torch.float32, tokens=2**20, seq_len=2**20)
    assert needed.activations > 2**20 * HEADS * 2**20 * 4
    with pytest.raises(ResourceError, match="Nothing was allocated"):
        check_fits(
            needed,
            torch.device("cpu"),
            "running attn_sublayer",
            "lower run.seq_len",
            available=(2**30, "test"),
        )
    assert math.isfinite(needed.total)


@pytest.mark.parametrize("split_at", [None, "proj", "fc1", "restore"])
def test_bench_variants_of_the_decoder_layer_compute_the_same(split_at: str | None) -> None:
    """bench.compare's split (two fusers, bridged channels; part 2 starting inside the token view for
    fc1/restore) and plain variants equal the channelled model, outputs and gradients."""
    from te_assembly.jobs.bench import bench_loss, build_variants, plan_to_model

    plan = load(LAYER).checked_plan()
    assert load(plan_to_model(plan)).checked_plan().input_layout == "sequence"
    torch.manual_seed(0)
    variants, split = build_variants(
        plan,
        Target.of("reference", kernels="te", device=torch.device("cpu"), dtype=F64),
        optimizer="sgd",
        lr=0.1,
        compare=True,
        split_at=split_at,
    )
    assert split is not None
    generator = torch.Generator().manual_seed(5)
    cpu = torch.device("cpu")
    x = sample_x(plan, 32, generator=generator, device=cpu, dtype=F64, seq_len=8)
    inputs = sample_public_inputs(plan, 32, generator=generator, device=cpu, dtype=F64, seq_len=8)
    outs = []
    for v in variants:
        v.model.zero_grad(set_to_none=True)
        out = v.model(x, **inputs)
        bench_loss(out, v.loss_outputs).backward()
        grads = {
            n.split(".", 2)[2] if n.startswith("parts.") else n: p.grad for n, p in v.model.named_parameters()
        }
        outs.append((out, grads))
    (ref, ref_grads), *others = outs
    for out, grads in others:
        torch.testing.assert_close(out.y, ref.y)
        assert out.y.shape == x.shape
        for name, value in ref.extras.items():
            torch.testing.assert_close(out.extras[name], value)
        for name, grad in ref_grads.items():
            torch.testing.assert_close(grads[name], grad, msg=name)
