"""The vocabulary head and the loss in chunks of tokens (``analysis/head.py``, ``engines/head_chunks.py``):
which steps make a language model's head, and that a loss taken chunk by chunk is the loss and every
gradient of the logits taken whole (float64), in either backward (gradients taken in forward for a sum,
chunks recomputed otherwise), while the whole logits never exist."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
import torch

import te_assembly
from te_assembly.engines.call_checks import CallError
from te_assembly.engines.head_chunks import TokenReduction, reduced_logits
from te_assembly.engines.target import Target
from te_assembly.jobs import objective
from te_assembly.testing.host_memory import MEASURABLE, PeakInUse
from tests.engines._helpers import plan_from_yaml, randomize

F64 = torch.float64
CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "model"
LANGUAGE_MODELS = sorted(
    p.stem for p in CONFIGS.glob("*.yaml") if te_assembly.load(p.stem).checked_plan().takes_token_ids
)


def _reference(name: str, overrides: tuple[str, ...] = ()) -> Any:
    torch.manual_seed(0)
    model = te_assembly.build(name, Target.of("reference", dtype=F64), overrides=list(overrides))
    randomize(model, scale=0.2)
    return model


def _batch(model: Any, rows: int = 3, seq: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(2)
    x = torch.randint(0, model.plan.in_features, (rows, seq), generator=gen)
    labels = x.roll(-1, dims=-1)
    labels[:, :3] = objective.IGNORE_INDEX  # a prompt's labels, as SFT masks them
    labels[0, -1] = objective.IGNORE_INDEX
    return x, labels


def _whole(model: Any, x: torch.Tensor, labels: torch.Tensor, z_loss: float) -> tuple[Any, dict[str, Any]]:
    model.zero_grad(set_to_none=True)
    y, extras = model(x)
    terms = objective.next_token_terms(y, labels, extras, model.loss_output_names, z_loss=z_loss)
    (3.0 * objective.total(terms)).backward()  # a scale, as grad_accum's division is one
    return terms, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _chunked(
    model: Any, x: torch.Tensor, labels: torch.Tensor, z_loss: float, summed: bool, tokens: int = 5
) -> tuple[Any, dict[str, Any]]:
    model.zero_grad(set_to_none=True)
    asked = objective.next_token_reduction(labels, tokens, z_loss=z_loss, summed=summed)
    with reduced_logits(model, asked):
        y, extras = model(x)
    assert y.shape == (*x.shape, 2 if z_loss else 1)
    terms = objective.next_token_terms(
        y, labels, extras, model.loss_output_names, z_loss=z_loss, reduced=True
    )
    (3.0 * objective.total(terms)).backward()
    return terms, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same(whole: tuple[Any, Any], chunked: tuple[Any, Any]) -> None:
    (terms, grads), (chunk_terms, chunk_grads) = whole, chunked
    assert terms.keys() == chunk_terms.keys()
    for name in terms:
        torch.testing.assert_close(chunk_terms[name], terms[name], rtol=1e-12, atol=1e-12)
    assert grads.keys() == chunk_grads.keys() and grads
    for name, grad in grads.items():
        torch.testing.assert_close(chunk_grads[name], grad, rtol=1e-10, atol=1e-12, msg=name)


def test_a_language_models_head_is_its_last_token_wise_steps_in_fusers_of_their_own() -> None:
    plan = te_assembly.load("llama_tiny").checked_plan()
    assert plan.head is not None
    assert [s.name for s in plan.steps[plan.head :]] == ["final_norm", "head"]
    head_fusers = {s.fuser for s in plan.steps[plan.head :]}
    assert len(head_fusers) == 1
    assert all(s.fuser not in head_fusers for s in plan.steps[: plan.head])
    assert te_assembly.load("moe_block").checked_plan().head is None  # not a language model


def test_the_head_stops_at_a_step_that_reads_from_before_it_or_returns_to_the_caller() -> None:
    plan = plan_from_yaml(
        """
        name: ends_oddly
        in_features: 64
        input_layout: token_ids
        ops:
          - {name: embed, module: Embedding, args: {num_embeddings: 64, embedding_dim: 8}}
          - {name: keep, op: MakeExtraOutput, extra_outputs: {out: {channel: kept, public: false}}}
          - {name: norm, op: RMSNorm, args: {normalized_shape: 8}}
          - {name: add, op: AddExtraInput, extra_inputs: {addend: kept}}
          - {name: seen, op: MakeExtraOutput}
          - {name: scale, op: ConstantScale, args: {scale: 2.0}}
          - {name: head, op: Linear, args: {in_features: 8, out_features: 64, bias: false}}
        """
    )
    # ``add`` reads a channel made before it and ``seen`` hands its tensor to the caller: the head
    # is what follows them.
    assert plan.head is not None
    assert [s.name for s in plan.steps[plan.head :]] == ["scale", "head"]


def test_a_lora_on_the_head_is_part_of_it_and_trains_the_same_in_chunks() -> None:
    model = _reference("llama_tiny", ("lora.targets=[head]", "lora.rank=2"))
    plan = model.plan
    assert [s.type for s in plan.steps[plan.head :]] == ["RMSNorm", "MakeExtraOutput", "Linear", "LoRA"]
    x, labels = _batch(model)
    whole = _whole(model, x, labels, 0.0)
    assert any("head_lora" in name for name in whole[1])
    for summed in (True, False):
        _assert_same(whole, _chunked(model, x, labels, 0.0, summed))


@pytest.mark.parametrize("name", LANGUAGE_MODELS)
def test_every_shipped_language_model_has_a_head_and_loses_nothing_in_chunks(name: str) -> None:
    """The loss, the z-loss, the router and MTP losses and every gradient, in both backwards."""
    model = _reference(name)
    assert model.plan.head is not None, name
    x, labels = _batch(model)
    whole = _whole(model, x, labels, 1e-2)
    for summed in (True, False):
        _assert_same(whole, _chunked(model, x, labels, 1e-2, summed))


@pytest.mark.parametrize("checkpointing", ["blocks", "all"])
def test_chunks_work_with_the_model_run_as_units(checkpointing: str) -> None:
    model = _reference("moe_lm")
    x, labels = _batch(model)
    whole = _whole(model, x, labels, 0.0)
    model.configure(activation_checkpointing=checkpointing)
    for summed in (True, False):
        _assert_same(whole, _chunked(model, x, labels, 0.0, summed, tokens=7))


def test_gemma2s_soft_capped_logits_are_capped_in_each_chunk(tmp_path: Path) -> None:
    from tests.hf.tiny import make

    model = te_assembly.from_hf(make("gemma2", tmp_path / "gemma2"), Target.of("reference", dtype=F64))
    assert [s.type for s in model.plan.steps[model.plan.head :]] == ["RMSNorm", "Linear", "Softcap"]
    x, labels = _batch(model)
    whole = _whole(model, x, labels, 0.0)
    _assert_same(whole, _chunked(model, x, labels, 0.0, True))


def test_a_summed_reduction_refuses_a_caller_that_weighs_its_rows() -> None:
    model = _reference("llama_tiny")
    x, labels = _batch(model)
    with reduced_logits(model, objective.next_token_reduction(labels, 5, summed=True)):
        y, _ = model(x)
    weights = torch.arange(y.numel(), dtype=F64).reshape(y.shape)
    with pytest.raises(RuntimeError, match="not only added up"):
        (y * weights).sum().backward()


def test_without_gradients_the_chunks_are_the_per_token_losses() -> None:
    model = _reference("llama_tiny")
    x, labels = _batch(model)
    with torch.no_grad():
        logits, _ = model(x)
        with reduced_logits(model, objective.next_token_reduction(labels, 4)):
            per_token, _ = model(x)
    expected = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none"
    )
    torch.testing.assert_close(per_token.reshape(-1), expected, rtol=1e-12, atol=1e-12)


def test_labels_of_another_shape_are_a_clear_error() -> None:
    model = _reference("llama_tiny")
    x, labels = _batch(model)
    with reduced_logits(model, TokenReduction(lambda logits, lab: logits[:, :1], labels[:, :-1], 4)):
        with pytest.raises(CallError, match="labels hold 33 tokens"):
            model(x)


# -- the whole logits never exist ----------------------------------------------------------------------


WIDE_VOCABULARY = """
name: wide_vocabulary
in_features: 16384
input_layout: token_ids
ops:
  - {name: embed, module: Embedding, args: {num_embeddings: 16384, embedding_dim: 16}}
  - {name: norm, op: RMSNorm, args: {normalized_shape: 16}}
  - {name: head, op: Linear, args: {in_features: 16, out_features: 16384, bias: false}}
"""


@pytest.mark.skipif(not MEASURABLE, reason="measuring the peak needs glibc's mallinfo2 (glibc 2.33+)")
@pytest.mark.parametrize("summed", [True, False])
def test_a_step_in_chunks_never_holds_the_whole_logits(summed: bool) -> None:
    """2,048 tokens over a 16,384-token vocabulary: 128 MiB of float32 logits. In chunks of 256 the step
    holds less than half of that at any op; with the logits whole it holds more than twice."""
    torch.manual_seed(0)
    model = te_assembly.build(plan_from_yaml(WIDE_VOCABULARY), Target.of("reference", dtype=torch.float32))
    x = torch.randint(0, 16384, (4, 512))
    labels = x.roll(-1, dims=-1)
    logits_bytes = x.numel() * 16384 * 4

    def step(chunks: bool) -> int:
        model.zero_grad(set_to_none=False)  # the gradients' memory exists already in both
        gc.collect()
        with PeakInUse() as measured:
            if chunks:
                with reduced_logits(model, objective.next_token_reduction(labels, 256, summed=summed)):
                    y, _ = model(x)
                loss = objective.next_token_terms(y, labels, {}, (), reduced=True)[objective.CROSS_ENTROPY]
            else:
                y, _ = model(x)
                loss = objective.cross_entropy(y, labels)
            loss.backward()
        return measured.peak

    step(True), step(False)  # warm-up: the gradients and one-time allocations
    assert step(True) < logits_bytes / 2
    assert step(False) > 2 * logits_bytes


@pytest.mark.skipif(not MEASURABLE, reason="measuring the peak needs glibc's mallinfo2 (glibc 2.33+)")
def test_the_memory_estimate_counts_one_chunk_of_logits_and_still_errs_high() -> None:
    from te_assembly.engines.memory import estimate

    plan = plan_from_yaml(WIDE_VOCABULARY)
    whole = estimate(plan, torch.float32, tokens=2048, trained=1, seq_len=512)
    chunked = estimate(plan, torch.float32, tokens=2048, trained=1, seq_len=512, chunk_tokens=256)
    assert chunked.loss == whole.loss // 8  # the cross-entropy's buffers of one chunk of 256
    assert chunked.activations < whole.activations / 4
    torch.manual_seed(0)
    model = te_assembly.build(plan, Target.of("reference", dtype=torch.float32))
    x = torch.randint(0, 16384, (4, 512))
    labels = x.roll(-1, dims=-1)

    def step() -> int:
        model.zero_grad(set_to_none=False)
        gc.collect()
        with PeakInUse() as measured:
            with reduced_logits(model, objective.next_token_reduction(labels, 256)):
                y, _ = model(x)
            objective.next_token_terms(y, labels, {}, (), reduced=True)[objective.CROSS_ENTROPY].backward()
        return measured.peak

    step()
    assert step() <= chunked.activations + chunked.loss


@pytest.mark.te
@pytest.mark.parametrize("name", ["llama_tiny", "gpt_oss_tiny", "deepseek_v3_tiny"])
def test_tes_fusers_run_the_head_in_chunks(name: str) -> None:
    """The TE engine (its fusers, the reference math inside on CPU) cuts its fusers where the head begins
    and calls the head's fusers chunk by chunk, in either backward."""
    torch.manual_seed(0)
    model = te_assembly.build(name, Target.of("te", kernels="reference", dtype=F64))
    randomize(model, scale=0.2)
    assert len(model.fusers) == len(model.plan.fusers)  # type: ignore[attr-defined]
    x, labels = _batch(model)
    whole = _whole(model, x, labels, 1e-2)
    for summed in (True, False):
        _assert_same(whole, _chunked(model, x, labels, 1e-2, summed))


def test_a_frozen_model_reduces_in_chunks_with_gradients_on() -> None:
    """Nothing to differentiate (every weight frozen, token ids in): the chunks are just the losses."""
    model = _reference("llama_tiny").requires_grad_(False)
    x, labels = _batch(model)
    with reduced_logits(model, objective.next_token_reduction(labels, 5)):
        y, _ = model(x)
    assert not y.requires_grad
    with torch.no_grad():
        logits, _ = model(x)
    whole = objective.cross_entropy(logits, labels)
    torch.testing.assert_close(
        objective.next_token_terms(y, labels, {}, (), reduced=True)["cross_entropy"], whole
    )


def test_explain_and_the_op_sheet_say_where_the_head_begins_and_what_runs_per_token() -> None:
    from te_assembly.catalog import OPS
    from te_assembly.views.op_sheet import op_sheet

    summary = _reference("llama_tiny").summary(width=240, expand=["all"])
    fuser_rows = [line for line in summary.splitlines() if "the head (run in chunks for a loss)" in line]
    assert len(fuser_rows) == 1 and "layers.1.add_mlp" in summary
    assert any("per token" in str(line) for line in op_sheet(OPS["Softcap"]))
    assert not any("per token" in str(line) for line in op_sheet(OPS["TopKRouter"]))
