"""The ``lora:`` section at config level: adapters join the plan as steps and channels, and every
mistake is a diagnostic at its key path, all at once, before any tensor exists."""

from __future__ import annotations

import te_assembly as ta
from te_assembly.catalog import ADAPTER_TYPES


def _codes(analysis: ta.Analysis) -> dict[str, str]:
    return {d.path: d.message for d in analysis.errors}


def test_adapters_are_steps_with_one_adapter_per_stacked_part() -> None:
    plan = ta.load("llama_tiny", ["lora.rank=4", "lora.targets=[layers.*.qkv:q+v, '*.fc1']"]).checked_plan()
    qkv = plan.step("layers.0.qkv_lora")
    assert qkv.args["parts"] == [64, 32, 32] and qkv.args["adapted"] == [True, False, True]
    assert plan.step("layers.1.fc1_lora").args["parts"] == [128, 128]
    assert plan.step("layers.0.qkv_lora_in").output_channels == ("layers.0.qkv_lora_x",)
    assert {s.name for s in plan.steps if s.type in ADAPTER_TYPES} == {
        f"layers.{n}.{p}_lora" for n in (0, 1) for p in ("qkv", "fc1")
    }
    # only the adapters train: A [4, 64] and B [part, 4] for q, v (qkv) and gate, up (fc1), per layer
    assert plan.num_trainable_params == 2 * (2 * 4 * 64 + 4 * (64 + 32) + 2 * 4 * 64 + 4 * 256)
    # block uses still cover their steps: each gained two per adapted projection
    assert [u.num_steps for u in plan.blocks[0].uses] == [16, 16]
    quoted = ta.load(
        "llama_tiny", ["lora.rank=4", "lora.targets=['layers.*.qkv:q,v', '*.fc1']"]
    ).checked_plan()
    assert quoted.step("layers.0.qkv_lora").args == qkv.args


def test_all_linear_leaves_the_head_and_experts_get_grouped_adapters() -> None:
    plan = ta.load("qwen2_moe_tiny", ["lora.rank=2"]).checked_plan()
    kinds = {s.name.split(".")[-1]: s.type for s in plan.steps if s.type in ADAPTER_TYPES}
    assert kinds["fc1_lora"] == "GroupedLoRA" and kinds["qkv_lora"] == "LoRA"
    assert "head_lora" not in kinds
    assert plan.step("layers.0.fc1_lora").input_channels == ("layers.0.fc1_lora_x", "layers.0.split_sizes")


def test_every_mistake_at_once_with_its_path_and_hint() -> None:
    targets = "lora.targets=[layers.*.qkx, layers.*.attn_norm, 'layers[*].fc1:gate,upp']"
    analysis = ta.load("llama_tiny", ["lora.rank=4", targets])
    found = _codes(analysis)
    assert "matches no step" in found["lora.targets[0]"]
    assert "RMSNorm" in found["lora.targets[1]"]
    assert "no part 'upp'" in found["lora.targets"]
    hints = {d.path: d.hint for d in analysis.errors}
    assert "layers.*.qkv" in (hints["lora.targets[0]"] or "")
    wide = ta.load("llama_tiny", ["lora.rank=40", "lora.targets=[layers.*.qkv]"])
    assert "wider than step 'layers.*.qkv'" in _codes(wide)["lora.rank"]
    assert {d.code for d in ta.load("llama_tiny", ["lora.rank=0"]).errors} == {"out-of-range"}


def test_no_rank_no_adapters_and_the_catalog_checks_a_hand_written_lora() -> None:
    assert not ta.load("llama_tiny").checked_plan().adapter_params
    model = {
        "name": "hand",
        "in_features": 8,
        "ops": [
            {
                "name": "keep",
                "op": "MakeExtraOutput",
                "extra_outputs": {"out": {"channel": "x", "public": False}},
            },
            {"name": "proj", "op": "Linear", "args": {"in_features": 8, "out_features": 6}},
            {
                "name": "lora",
                "op": "LoRA",
                "args": {"in_features": 8, "out_features": 6, "rank": 2, "parts": [4, 4]},
                "extra_inputs": {"x": "x"},
            },
        ],
    }
    found = {d.code for d in ta.validate_model(model) if d.is_error}
    assert found == {"bad-args"}
    model["ops"][2]["args"] = {"in_features": 6, "out_features": 6, "rank": 2}
    assert "channel-width" in {d.code for d in ta.validate_model(model) if d.is_error}


def test_parts_named_in_several_targets_are_all_adapted() -> None:
    """Two entries naming parts of one step adapt the union of those parts, whatever their order, and
    an entry naming the whole step wins over one naming a part."""
    expected = {"q": [True, False, False], "v": [False, False, True]}
    for targets in ("[layers.*.qkv:q, layers.*.qkv:v]", "[layers.*.qkv:v, 'layers[*].qkv:q']"):
        plan = ta.load("llama_tiny", ["lora.rank=4", f"lora.targets={targets}"]).checked_plan()
        for layer in (0, 1):
            args = plan.step(f"layers.{layer}.qkv_lora").args
            assert args["adapted"] == [a or b for a, b in zip(*expected.values(), strict=True)]
        # A for q and v, B [64, 4] for q and [32, 4] for v, in each of the two layers
        assert plan.num_trainable_params == 2 * (2 * 4 * 64 + 4 * (64 + 32))
    for targets in ("[layers.*.qkv:k, layers.*.qkv]", "[layers.*.qkv, layers.*.qkv:k]"):
        plan = ta.load("llama_tiny", ["lora.rank=4", f"lora.targets={targets}"]).checked_plan()
        assert plan.step("layers.0.qkv_lora").args.get("adapted") in (None, [True, True, True])
        assert plan.num_trainable_params == 2 * (3 * 4 * 64 + 4 * (64 + 32 + 32))
