"""Token ids in, logits out: the Embedding step, tied heads, the call checks and the validator's rules."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import te_assembly
from te_assembly.engines.target import Target
from te_assembly.engines.weights import copy_weights
from te_assembly.errors import ConfigError, InputShapeError
from tests.language.lm import tiny_lm


def _ids(vocab: int, batch: int = 2, seq: int = 6, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def test_logits_over_the_vocabulary_and_the_tie_is_one_parameter() -> None:
    model = te_assembly.build(tiny_lm(vocab=40), Target.of("reference", dtype=torch.float64))
    y, _ = model(_ids(40))
    assert y.shape == (2, 6, 40)
    assert model.step_module("head").basic_ops[0].weight is model.step_module("embed").weight
    names = [n for n, _ in model.named_parameters()]
    assert "steps.embed.weight" in names and not any(n.startswith("steps.head") for n in names)
    untied = te_assembly.load(tiny_lm(vocab=40, tie=False)).checked_plan()
    assert untied.num_params - model.plan.num_params == 40 * 16  # the head's weight counted once


def test_the_tied_weight_gets_both_gradients_float64() -> None:
    torch.manual_seed(0)
    tied = te_assembly.build(tiny_lm(vocab=30), Target.of("reference", dtype=torch.float64))
    untied = te_assembly.build(tiny_lm(vocab=30, tie=False), Target.of("reference", dtype=torch.float64))
    state = dict(tied.state_dict())
    state["steps.head.basic_ops.0.weight"] = state["steps.embed.weight"].clone()
    untied.load_state_dict(state)
    x = _ids(30)
    weights = torch.randn(2, 6, 30, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for model in (tied, untied):
        (model(x).y * weights).sum().backward()
    expected = untied.steps.embed.weight.grad + untied.step_module("head").basic_ops[0].weight.grad
    assert torch.allclose(tied.steps.embed.weight.grad, expected, rtol=1e-12, atol=1e-12)
    # Both contributions are there: neither alone is the sum.
    assert not torch.allclose(tied.steps.embed.weight.grad, untied.steps.embed.weight.grad)


def test_a_tied_model_is_stored_once_and_loads_tied(tmp_path: Path) -> None:
    model = te_assembly.build(tiny_lm(vocab=24), "reference")
    assert "steps.head.basic_ops.0.weight" not in model.state_dict()
    out = te_assembly.save_pretrained(model, tmp_path / "pre")
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "steps.embed.weight" in keys and "steps.head.basic_ops.0.weight" not in keys
    assert "tied_weights" in (out / "config.yaml").read_text()
    loaded = te_assembly.from_pretrained(out, "reference")
    assert loaded.step_module("head").basic_ops[0].weight is loaded.step_module("embed").weight
    x = _ids(24)
    assert torch.equal(loaded(x).y, model.eval()(x).y)


def test_token_ids_out_of_range_are_refused_before_any_op_runs() -> None:
    model = te_assembly.build(tiny_lm(vocab=20), "reference")
    bad = _ids(20)
    bad[1, 3] = 20
    with pytest.raises(InputShapeError, match=r"token id 20 at x\[1, 3\] is outside its vocabulary of 20"):
        model(bad)
    with pytest.raises(InputShapeError, match="token id -1"):
        model(torch.full((1, 2), -1))
    with pytest.raises(InputShapeError, match="integer token ids"):
        model(torch.zeros(1, 4))
    with pytest.raises(InputShapeError, match=r"\[batch, seq\]"):
        model(torch.zeros(4, dtype=torch.int64))


def _errors(model: dict) -> list:
    with pytest.raises(ConfigError) as caught:
        te_assembly.load(model).checked_plan()
    return caught.value.diagnostics


def test_only_an_embedding_may_take_token_ids() -> None:
    model = tiny_lm(vocab=20)
    model["ops"].insert(0, {"name": "pre", "op": "RMSNorm", "args": {"normalized_shape": 20}})
    found = _errors(model)
    assert any(
        d.code == "layout-mismatch" and "'pre'" in d.message and "token ids" in d.message for d in found
    )


def test_an_embedding_needs_token_ids() -> None:
    model = tiny_lm(vocab=20)
    model["input_layout"] = "sequence"
    found = _errors(model)
    assert any(d.code == "layout-mismatch" and "Embedding" in d.message for d in found)


def test_tie_errors_name_the_problem() -> None:
    unknown = tiny_lm(vocab=20)
    unknown["ops"][-1]["tie_weight"] = "embd"
    found = _errors(unknown)
    assert any(d.code == "unknown-step" and "embed" in (d.hint or "") for d in found)
    shapes = tiny_lm(vocab=20)
    shapes["ops"][-1]["tie_weight"] = "fc"
    found = _errors(shapes)
    assert any(d.code == "cannot-tie" and "(20, 16)" in d.message and "(16, 16)" in d.message for d in found)
    norm = tiny_lm(vocab=20)
    norm["ops"][1]["tie_weight"] = "embed"
    assert any(d.code == "cannot-tie" and "RMSNorm" in d.message for d in _errors(norm))


def test_the_shipped_language_models_plan_with_tied_heads() -> None:
    for name in ("dense_lm", "moe_lm"):
        plan = te_assembly.load(name).checked_plan()
        assert plan.takes_token_ids and plan.out_features == plan.in_features
        assert plan.tied_params == {"steps.head.basic_ops.0.weight": "steps.embed.weight"}
        shapes = [s.param_shapes for s in plan.steps]
        total = sum(math.prod(v) for p in shapes for v in p.values())
        assert plan.num_params == total - plan.in_features * int(plan.dims["hidden"])


@pytest.mark.te
def test_the_te_engine_ties_the_head_inside_its_fuser_and_matches_the_reference() -> None:
    pytest.importorskip("transformer_engine.pytorch", reason="needs Transformer Engine")
    torch.manual_seed(0)
    ref = te_assembly.build(tiny_lm(vocab=32, attention=True), Target.of("reference", dtype=torch.float64))
    te = te_assembly.build(
        tiny_lm(vocab=32, attention=True), Target.of("te", kernels="reference", dtype=torch.float64)
    )
    copy_weights(ref, te)
    assert te.step_module("head").basic_ops[0].weight is te.step_module("embed").weight
    x = _ids(32)
    for model in (ref, te):
        model(x).y.square().mean().backward()
    assert torch.allclose(ref(x).y, te(x).y, rtol=1e-10, atol=1e-12)
    assert torch.allclose(ref.steps.embed.weight.grad, te.steps.embed.weight.grad, rtol=1e-9, atol=1e-12)


def test_the_memory_estimate_counts_the_cross_entropy_buffers() -> None:
    """What autograd keeps for the loss of ``tokens`` positions (measured with saved-tensor hooks) is
    within the estimate's cross-entropy share, which grows with the vocabulary."""
    from te_assembly.engines.memory import estimate
    from te_assembly.jobs import objective

    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel() * t.element_size())
        return t

    vocab, tokens = 4096, 64
    logits = torch.randn(1, tokens, vocab, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (1, tokens))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        objective.next_token_terms(logits, labels, {}, ())
    plan = te_assembly.load(tiny_lm(vocab=vocab)).checked_plan()
    small = te_assembly.load(tiny_lm(vocab=256)).checked_plan()
    big = estimate(plan, torch.bfloat16, tokens=tokens, models=1, trained=1)
    assert big.loss >= sum(saved) > 0
    assert estimate(small, torch.bfloat16, tokens=tokens).loss < big.loss
