"""Training a frozen base with LoRA adapters, in one process: only the adapters train and are kept
(with the base's SHA-256), a resume is exact, activation checkpointing changes nothing, and the memory
estimate counts gradients and optimizer state for the adapters only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import te_assembly
from te_assembly.engines.base import AssembledModel
from te_assembly.engines.memory import estimate
from te_assembly.formats.checkpoint import list_checkpoints, model_state, read_meta
from te_assembly.jobs.train.settings import TrainSettings

MODEL = "llama_tiny"


def _settings(out: Path, **changes: object) -> TrainSettings:
    base = {"steps": 6, "batch_tokens": 4 * 32, "seq_len": 32, "plot": False, "eval_every": 0}
    base.update(checkpoint_every=3, keep_checkpoints=4, out_dir=str(out), warmup_steps=2)
    return TrainSettings(**{**base, **changes})  # type: ignore[arg-type]


def _losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def _target() -> te_assembly.Target:
    return te_assembly.Target.of("reference", dtype=torch.float64, seed=2)


def test_adapters_only_resume_exactly_and_checkpointing_changes_nothing(tmp_path: Path) -> None:
    plan = te_assembly.load(MODEL, ["lora.rank=4"]).checked_plan()
    te_assembly.train(plan, _target(), _settings(tmp_path / "full"))
    checkpoints = dict(list_checkpoints(tmp_path / "full"))
    saved = model_state(checkpoints[6])[1]
    assert set(saved) == set(plan.adapter_params)
    base = read_meta(checkpoints[6])["run"]["base"]
    assert base["init_from"] is None and len(base["sha256"]) == 64

    te_assembly.train(plan, _target(), _settings(tmp_path / "half", stop_after=3))
    te_assembly.train(plan, _target(), _settings(tmp_path / "half", resume=True))
    assert _losses(tmp_path / "half") == _losses(tmp_path / "full")
    resumed = model_state(dict(list_checkpoints(tmp_path / "half"))[6])[1]
    assert all(torch.equal(resumed[k], saved[k]) for k in saved)

    te_assembly.train(plan, _target(), _settings(tmp_path / "ckpt", activation_checkpointing="blocks"))
    torch.testing.assert_close(_losses(tmp_path / "ckpt"), _losses(tmp_path / "full"), rtol=1e-12, atol=0)


def test_the_memory_estimate_counts_only_the_adapters_state() -> None:
    full = te_assembly.load(MODEL).checked_plan()
    lora = te_assembly.load(MODEL, ["lora.rank=4"]).checked_plan()
    whole = estimate(full, torch.float32, trained=1, optimizer="adamw")
    adapters = estimate(lora, torch.float32, trained=1, optimizer="adamw")
    assert adapters.parameters == lora.num_params * 4  # the frozen base is still held
    assert adapters.optimizer == lora.num_trainable_params * 4 * 2  # AdamW's two moments, adapters only
    assert adapters.gradients == lora.num_trainable_params * 4
    assert adapters.optimizer < 0.1 * whole.optimizer


def _engine(engine: str) -> te_assembly.Target:
    if engine == "te":
        pytest.importorskip("transformer_engine.pytorch", reason="the TE engine needs transformer_engine")
        return te_assembly.Target.of("te", kernels="reference", dtype=torch.float64, seed=2)
    return _target()


def _with_trained_adapters(dropout: float, engine: str = "reference") -> AssembledModel:
    """llama_tiny with rank-4 adapters on every projection (B away from zero, as after training)."""
    plan = te_assembly.load(MODEL, ["lora.rank=4", f"lora.dropout={dropout}"]).checked_plan()
    model = _engine(engine).build(plan, seed=3)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in plan.adapter_params:
                param.copy_(torch.randn(param.shape, generator=generator, dtype=param.dtype) * 0.3)
    return model


@pytest.mark.parametrize("engine", ["reference", pytest.param("te", marks=pytest.mark.te)])
def test_lora_dropout_is_off_in_eval_mode_and_in_generation(engine: str) -> None:
    from te_assembly.jobs.generate.decode import decode
    from te_assembly.jobs.generate.job import next_token
    from te_assembly.jobs.generate.settings import GenerateSettings

    dropped, plain = _with_trained_adapters(0.5, engine), _with_trained_adapters(0.0, engine)
    ids = torch.randint(0, 272, (2, 12), generator=torch.Generator().manual_seed(0))
    dropped.train()
    torch.manual_seed(0)
    assert not torch.equal(dropped(ids).y, plain.eval()(ids).y)  # dropout does act in training
    dropped.eval()
    first, second = dropped(ids).y, dropped(ids).y
    assert torch.equal(first, second)
    assert torch.equal(first, plain(ids).y)
    assert (
        first - _engine(engine).build(dropped.plan, seed=3).eval()(ids).y
    ).abs().max() > 1e-3  # adapters act

    settings = GenerateSettings(max_new_tokens=8, temperature=0.0, context=64)
    prompts = [ids[0].tolist(), ids[1, :5].tolist()]
    dropped.train()  # generation itself puts the model in eval mode
    with_dropout = decode(dropped, prompts, settings, torch.Generator(), next_token, frozenset())
    without = decode(plain, prompts, settings, torch.Generator(), next_token, frozenset())
    assert with_dropout.ids == without.ids and all(len(row) == 8 for row in with_dropout.ids)


def test_a_merge_into_a_tied_weight_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    """An adapter on a head tied to the embedding: folding it in would change the embedding too, so no
    merged model computes what the adapted one does; the export says so and writes nothing."""
    from te_assembly.errors import ArgumentError

    plan = te_assembly.load("dense_lm", ["lora.rank=2", "lora.targets=[all-linear,head]"]).checked_plan()
    assert "steps.head.basic_ops.0.weight" in plan.tied_params
    te_assembly.train(plan, _target(), _settings(tmp_path / "run", steps=2, checkpoint_every=2))
    with pytest.raises(ArgumentError, match=r"tied to 'steps\.embed\.weight'"):
        te_assembly.export_checkpoint(tmp_path / "run", tmp_path / "merged", merge=True)
    assert not (tmp_path / "merged").exists()
    te_assembly.export_checkpoint(tmp_path / "run", tmp_path / "kept")  # the adapters kept: fine
