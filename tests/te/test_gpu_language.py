"""The gpu tier for language-model jobs with TE's kernels: generation through the key/value cache in the TE
engine (TE's fusers for every step but attention, which attends over the cache), ``eval``'s score against
the reference engine, and instruction fine-tuning steps with TE's fused cross-entropy under an FP8 recipe.
Tolerances: bfloat16's of ``jobs/verify.py`` for logits; 2% for a mean loss in bfloat16."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import te_assembly
from te_assembly.analysis.recipes import load_recipe
from te_assembly.engines.target import Target
from te_assembly.jobs.verify import TOLERANCES, compare

pytestmark = pytest.mark.gpu

SMALL = ["model.dims.layers=2", "model.dims.hidden=128", "model.dims.ffn=256"]


def _models() -> tuple[object, object]:
    """dense_lm in the TE engine (TE's kernels, bfloat16, on the GPU) and the same weights in the
    reference engine (float32, on the GPU)."""
    plan = te_assembly.load("dense_lm", SMALL).checked_plan()
    torch.manual_seed(0)
    te_model = Target.of("te", "te", "cuda", torch.bfloat16).build(plan)
    reference = Target.of("reference", "te", "cuda", torch.float32).build(plan)
    weights = {
        k: v.float()
        for k, v in te_model.state_dict().items()
        if isinstance(v, torch.Tensor) and v.is_floating_point()  # not TE's _extra_state
    }
    missing, _ = reference.load_state_dict(weights, strict=False)
    assert not missing
    return te_model, reference


def test_kv_cache_generation_in_the_te_engine_equals_its_full_forward() -> None:
    from te_assembly.jobs.generate.decode import decode
    from te_assembly.jobs.generate.settings import GenerateSettings

    te_model, _ = _models()
    prompt = torch.randint(0, 256, (24,), generator=torch.Generator().manual_seed(1)).tolist()
    seen: list[torch.Tensor] = []

    def choose(logits: torch.Tensor, settings: GenerateSettings, generator: torch.Generator) -> int:
        seen.append(logits.float().clone())
        return int(logits.argmax())

    settings = GenerateSettings(temperature=0, max_new_tokens=16)
    out = decode(te_model, [prompt], settings, torch.Generator(), choose, frozenset())  # type: ignore[arg-type]
    assert out.cached and len(out.ids[0]) == 16
    history = list(prompt)
    for step, token in enumerate(out.ids[0]):
        with torch.no_grad():
            full = te_model(torch.tensor([history], device="cuda")).y[0, -1].float()  # type: ignore[operator]
        row = compare(f"logits {step}", "logits", seen[step], full, TOLERANCES["bfloat16"])
        assert row.passed, (step, row.max_abs, row.max_rel)
        history.append(token)


def test_eval_score_in_the_te_engine_matches_the_reference_engine() -> None:
    from te_assembly.jobs.eval.job import score

    te_model, reference = _models()
    ids = torch.randint(0, 256, (2048,), generator=torch.Generator().manual_seed(2))
    mine, count, _ = score(te_model, ids, 256, 128, batch=4)  # type: ignore[arg-type]
    theirs, same, _ = score(reference, ids, 256, 128, batch=4)  # type: ignore[arg-type]
    assert count == same == len(ids) - 1
    assert abs(mine / count - theirs / same) <= 0.02 * (theirs / same)


def test_instruction_fine_tuning_with_fused_cross_entropy_and_fp8(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    from te_assembly.data.settings import DataSettings, TokenizerSettings
    from te_assembly.jobs.train.lm_task import uses_fused_cross_entropy
    from te_assembly.jobs.train.settings import TrainSettings

    words = [
        "[UNK]",
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "user",
        "assistant",
        "sky",
        "blue",
        "grass",
    ]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    (tmp_path / "tokenizer.json").write_text(backend.to_str())
    template = (
        "{% for m in messages %}{{ '<|im_start|> ' + m['role'] + ' ' + m['content'] + ' <|im_end|> ' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|> assistant ' }}{% endif %}"
    )
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    pairs = [("sky", "blue"), ("grass", "grass blue")]
    lines = [
        json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
        for q, a in pairs * 8
    ]
    (tmp_path / "sft.jsonl").write_text("\n".join(lines) + "\n")
    data = DataSettings(
        path=str(tmp_path / "sft.jsonl"),
        format="chat",
        val_fraction=0.0,
        tokenizer=TokenizerSettings(path=str(tmp_path / "tokenizer.json")),
    )
    plan = te_assembly.load("dense_lm", SMALL).checked_plan()
    target = Target.of("te", "te", "cuda", torch.bfloat16, recipe=load_recipe("fp8_delayed"))
    assert uses_fused_cross_entropy(target)
    settings = TrainSettings(
        steps=30,
        batch_tokens=16 * 32,
        seq_len=32,
        lr=3e-3,
        warmup_steps=0,
        plot=False,
        eval_every=0,
        out_dir=str(tmp_path / "run"),
    )
    result = te_assembly.train(plan, target, settings, data=data)
    losses = result.losses
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5, losses


def test_the_loss_in_chunks_through_tes_kernels_equals_the_logits_whole() -> None:
    """``train.loss_chunk_tokens`` with TE's kernels and fused cross-entropy on the GPU: the head's
    fusers run chunk by chunk (gradients taken in forward), against the logits whole; bfloat16's 2%."""
    from te_assembly.engines.head_chunks import reduced_logits
    from te_assembly.jobs import objective

    te_model, _ = _models()
    x = torch.randint(0, 256, (4, 64), generator=torch.Generator().manual_seed(3)).cuda()
    labels = x.roll(-1, dims=-1)
    results = []
    for chunks in (False, True):
        te_model.zero_grad(set_to_none=True)  # type: ignore[attr-defined]
        asked = objective.next_token_reduction(labels, 64, fused=True) if chunks else None
        with reduced_logits(te_model, asked):  # type: ignore[arg-type]
            y, _ = te_model(x)  # type: ignore[operator]
        loss = objective.next_token_terms(y, labels, {}, (), fused=True, reduced=chunks)[
            objective.CROSS_ENTROPY
        ]
        loss.backward()
        grads = {n: p.grad.float().clone() for n, p in te_model.named_parameters() if p.grad is not None}  # type: ignore[attr-defined]
        results.append((float(loss), grads))
    (whole, whole_grads), (chunked, chunked_grads) = results
    assert abs(chunked - whole) <= 0.02 * abs(whole)
    assert whole_grads.keys() == chunked_grads.keys()
    for name, grad in whole_grads.items():
        difference = (chunked_grads[name] - grad).norm() / grad.norm().clamp(min=1e-12)
        assert difference <= 0.02, (name, float(difference))
