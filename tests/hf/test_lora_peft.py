"""LoRA adapters equal PEFT's: a PEFT adapter (non-zero B) on a tiny random transformers model, put on
te_assembly's import with ``with_adapter``, gives the same logits, loss and adapter gradients in float64
(transformers' float32 islands removed, as in the Hugging Face comparison); te_assembly's own adapters,
written in PEFT's format, load in PEFT onto the transformers model with the same logits; a merged
export equals the unmerged model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from te_assembly.engines.target import Target
from te_assembly.formats.adapters import (
    adapter_plan,
    merged_model,
    peft_tensors,
    with_adapter,
    write_peft,
)
from te_assembly.formats.hf.convert import from_hf
from te_assembly.jobs.verify_hf import float64_islands_removed, load_transformers
from tests.hf.tiny import token_ids

peft = pytest.importorskip("peft", reason="the PEFT comparison needs peft (the dev extras)")
pytestmark = pytest.mark.slow

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _peft_model(folder: Path, modules: list[str], rank: int, alpha: float, rslora: bool = False):  # type: ignore[no-untyped-def]
    base = load_transformers(folder, torch.float64)
    config = peft.LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=modules, init_lora_weights=False, use_rslora=rslora
    )
    torch.manual_seed(7)
    return peft.get_peft_model(base, config)


def _loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
    )


def _theirs(model, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # type: ignore[no-untyped-def]
    model.zero_grad()
    with float64_islands_removed(model):
        logits = model(input_ids=ids).logits
    _loss(logits, ids).backward()
    grads = {
        k.replace(".default", ""): p.grad
        for k, p in model.named_parameters()
        if p.requires_grad and p.grad is not None
    }
    return logits.detach(), grads


def _mine(model, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # type: ignore[no-untyped-def]
    model.train()
    model.zero_grad()
    logits = model(ids).y
    _loss(logits, ids).backward()
    grads = {k: p.grad for k, p in model.named_parameters() if p.requires_grad}
    return logits.detach(), grads


@pytest.mark.parametrize(
    ("variant", "modules", "rslora"),
    [
        ("llama", ALL, False),
        ("llama", ["q_proj", "v_proj"], False),  # PEFT's default for Llama: parts of the stacked qkv
        ("qwen2", ["q_proj", "k_proj", "up_proj"], True),
        ("mixtral", ["q_proj", "o_proj"], False),
        ("mistral", ALL, False),
        ("qwen3", ["k_proj", "o_proj", "gate_proj", "down_proj"], False),
        ("qwen2_moe", ["v_proj", "gate_proj", "up_proj", "down_proj"], False),  # the shared expert's MLP
        # DeepSeek's latent attention: its projections (kv_b_proj is inside the attention step)
        ("deepseek_v3", ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj"], False),
        ("gpt_oss", ["q_proj", "k_proj", "v_proj", "o_proj"], True),  # biased projections, sinks
    ],
)
def test_peft_adapter_equals_peft(
    variant: str, modules: list[str], rslora: bool, hf_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    folder = hf_dir(variant)
    theirs = _peft_model(folder, modules, rank=4, alpha=8.0, rslora=rslora)
    theirs.save_pretrained(tmp_path / "adapter")
    base = from_hf(folder, Target.of("reference", dtype=torch.float64))
    mine = with_adapter(base, tmp_path / "adapter")
    ids = token_ids()
    their_logits, their_grads = _theirs(theirs, ids)
    my_logits, my_grads = _mine(mine, ids)
    assert (my_logits - their_logits).abs().max() <= 1e-10
    # The adapters really change the output: the comparison is not one of two bases.
    assert (
        my_logits - from_hf(folder, Target.of("reference", dtype=torch.float64))(ids).y
    ).abs().max() > 1e-4
    mapped = peft_tensors(mine.plan, my_grads)
    assert set(mapped) == set(their_grads)  # every adapter matrix, and only those, trains
    for name, grad in mapped.items():
        assert (grad - their_grads[name]).abs().max() <= 1e-10, name
    frozen = [n for n, p in mine.named_parameters() if not p.requires_grad]
    assert len(frozen) == len(list(base.parameters()))


def test_exported_adapter_loads_in_peft_with_the_same_logits(
    hf_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    folder = hf_dir("llama")
    base = from_hf(folder, Target.of("reference", dtype=torch.float64))
    plan = adapter_plan(base.plan, {"rank": 4, "alpha": 16.0, "targets": ["all-linear"]})
    mine = Target.of("reference", dtype=torch.float64).build(plan, seed=3)
    state = dict(base.state_dict())
    with torch.no_grad():  # trained adapters: B away from zero
        for name, param in mine.named_parameters():
            if name in plan.adapter_params:
                state[name] = torch.randn_like(param) * 0.1
    mine.load_state_dict(state)
    out = write_peft(plan, dict(mine.state_dict()), tmp_path / "adapter")
    theirs = peft.PeftModel.from_pretrained(load_transformers(folder, torch.float64), out).eval()
    ids = token_ids()
    with float64_islands_removed(theirs):
        their_logits = theirs(input_ids=ids).logits
    my_logits = mine.eval()(ids).y
    assert (my_logits - their_logits).abs().max() <= 1e-10
    merged = merged_model(mine)
    assert not merged.plan.adapter_params
    assert (merged(ids).y - my_logits).abs().max() <= 1e-10


def test_a_peft_adapter_survives_import_export_and_reimport(
    hf_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    """Every adapter_config.json field te_assembly reads is written back by the export (none left to
    PEFT's defaults: alpha 12 and rank 4 with rsLoRA scale by 6, not 2 or 3), and the re-imported adapter
    gives the same logits as the first import and as PEFT."""
    import json

    folder = hf_dir("llama")
    modules = ["q_proj", "v_proj", "down_proj"]
    base = load_transformers(folder, torch.float64)
    config = peft.LoraConfig(
        r=4,
        lora_alpha=12,
        lora_dropout=0.1,
        target_modules=modules,
        init_lora_weights=False,
        use_rslora=True,
    )
    torch.manual_seed(11)
    theirs = peft.get_peft_model(base, config)
    theirs.save_pretrained(tmp_path / "adapter")
    original = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    target = Target.of("reference", dtype=torch.float64)
    first = with_adapter(from_hf(folder, target), tmp_path / "adapter")
    write_peft(first.plan, first.state_dict(), tmp_path / "exported")
    written = json.loads((tmp_path / "exported" / "adapter_config.json").read_text())
    for field in ("r", "lora_alpha", "lora_dropout", "use_rslora", "peft_type", "bias", "fan_in_fan_out"):
        assert written[field] == original[field], (field, written[field], original[field])
    assert sorted(written["target_modules"]) == sorted(original["target_modules"]) == sorted(modules)
    again = with_adapter(from_hf(folder, target), tmp_path / "exported")
    assert again.plan.step("layers.0.qkv_lora").args == first.plan.step("layers.0.qkv_lora").args
    ids = token_ids()
    with torch.no_grad():
        reimported, imported = again(ids).y, first(ids).y
        theirs.eval()
        with float64_islands_removed(theirs):
            peft_logits = theirs(input_ids=ids).logits
    assert torch.equal(reimported, imported)
    assert (imported - peft_logits).abs().max() <= 1e-10
    reloaded = peft.PeftModel.from_pretrained(load_transformers(folder, torch.float64), tmp_path / "exported")
    assert reloaded.peft_config["default"].use_rslora and reloaded.peft_config["default"].lora_alpha == 12
