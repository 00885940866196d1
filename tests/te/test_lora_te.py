"""LoRA adapters in TE's fusers: the frozen projections stay TE ops, the adapter steps run inside the same
``OperationFuser`` as reference ops, and the TE engine equals the reference engine on the same weights
(logits and every adapter's gradient, float64 on CPU); the base's parameters get no gradient. On a GPU
(the gpu tier): an FP8 base with bfloat16 adapters trains, its loss falls, and only the adapters move."""

from __future__ import annotations

import pytest
import torch

import te_assembly
from te_assembly.engines.target import Target

CASES = [
    ("llama_tiny", "te", []),
    ("qwen2_moe_tiny", "reference", []),
    ("llama_tiny", "te", ["lora.dora=true"]),
]
"""The last: DoRA, its view of each projection's weight tied to the TE op's own."""


def _pair(model: str, kernels: str, more: list[str]) -> tuple[torch.nn.Module, torch.nn.Module]:
    plan = te_assembly.load(model, ["lora.rank=4", *more]).checked_plan()
    te_model = Target.of("te", kernels, dtype=torch.float64).build(plan, seed=1)
    reference = Target.of("reference", dtype=torch.float64).build(plan, seed=1)
    state = {k: v for k, v in te_model.state_dict().items() if not k.endswith("_extra_state")}
    with torch.no_grad():  # trained adapters: B away from zero
        for name in plan.adapter_params:
            state[name] = torch.randn_like(state[name]) * 0.1
    te_model.load_state_dict({**te_model.state_dict(), **state})
    reference.load_state_dict(state)
    return te_model, reference


@pytest.mark.te
@pytest.mark.parametrize(("model", "kernels", "more"), CASES)
def test_adapters_in_te_fusers_equal_the_reference_engine(model: str, kernels: str, more: list[str]) -> None:
    from te_assembly.engines.te import gpu_only_steps

    plan = te_assembly.load(model, ["lora.rank=4", *more]).checked_plan()
    if kernels == "te" and gpu_only_steps(plan, "te"):
        kernels = "reference"  # TE's attention kernels need a GPU: our math inside TE's fusers
    te_model, reference = _pair(model, kernels, more)
    ids = torch.randint(0, 200, (2, 9), generator=torch.Generator().manual_seed(0))
    outs = []
    for m in (te_model, reference):
        m.train()
        out = m(ids)
        (out.y.square().mean() + sum(v.sum() for v in out.extras.values())).backward()
        outs.append((out.y.detach(), {n: p.grad for n, p in m.named_parameters() if p.requires_grad}))
    (te_y, te_grads), (ref_y, ref_grads) = outs
    torch.testing.assert_close(te_y, ref_y, rtol=1e-10, atol=1e-12)
    assert set(te_grads) == set(ref_grads) == set(plan.adapter_params)
    for name in ref_grads:
        torch.testing.assert_close(te_grads[name], ref_grads[name], rtol=1e-9, atol=1e-12)
    frozen = [p for n, p in te_model.named_parameters() if n not in plan.adapter_params]
    assert frozen and all(p.grad is None and not p.requires_grad for p in frozen)


@pytest.mark.gpu
def test_fp8_base_with_bf16_adapters_trains(tmp_path: object) -> None:
    from te_assembly.analysis.recipes import load_recipe
    from te_assembly.jobs.train import train
    from te_assembly.jobs.train.settings import TrainSettings

    analysis = te_assembly.load("dense_lm", ["model.dims.hidden=128", "model.dims.ffn=256", "lora.rank=8"])
    plan = analysis.checked_plan()
    target = Target.of("te", "te", "cuda", torch.bfloat16, recipe=load_recipe("fp8_current"))
    settings = TrainSettings(steps=40, out_dir=str(tmp_path), plot=False, eval_every=40, checkpoint_every=0)
    result = train(plan, target, settings)
    first, last = sum(result.losses[:5]) / 5, sum(result.losses[-5:]) / 5
    assert last < first - 0.05, (first, last)
    frozen = [p for n, p in result.model.named_parameters() if n not in plan.adapter_params]
    assert frozen and not any(p.requires_grad for p in frozen)
