"""DeepSeek's latent attention at config level: the packed widths (queries | latent | shared key) are
checked where they are set, a latent whose width disagrees across its channel is named at the channel,
and every knob of the layer is a diagnostic before any tensor exists."""

from __future__ import annotations

from pathlib import Path

import yaml

import te_assembly as ta
from te_assembly.config.locations import configs_dir


def _errors(analysis: ta.Analysis) -> dict[str, str]:
    return {f"{d.path} [{d.code}]": d.message for d in analysis.errors}


def _with_block(tmp_path: Path, edit: dict[str, dict[str, object]]) -> ta.Analysis:
    """deepseek_v3_tiny as a user's copy (model and MoE layer block in their own folder), ``edit``
    merged into the named steps' args."""
    block = yaml.safe_load((configs_dir() / "block" / "hf_deepseek_layer.yaml").read_text())
    block["name"] = "my_layer"
    for op in block["ops"]:
        if op["name"] in edit:
            op["args"] = {**op.get("args", {}), **edit[op["name"]]}
    model = (configs_dir() / "model" / "deepseek_v3_tiny.yaml").read_text()
    model = model.replace("name: deepseek_v3_tiny", "name: mine").replace(
        "block: hf_deepseek_layer\n", "block: my_layer\n"
    )
    for folder in ("block", "model"):
        (tmp_path / folder).mkdir()
    (tmp_path / "block" / "my_layer.yaml").write_text(yaml.safe_dump(block, sort_keys=False))
    (tmp_path / "model" / "mine.yaml").write_text(model)
    return ta.load("mine", config_dirs=[tmp_path])


def test_the_shipped_model_packs_queries_latent_and_shared_key() -> None:
    plan = ta.load("deepseek_v3_tiny").checked_plan()
    attn = plan.step("layers.0.attn")
    # 4 heads x (16 + 8) query features, a 32-wide latent and the 8-wide shared key
    assert (attn.in_width, attn.out_width) == (4 * 24 + 32 + 8, 4 * 16)
    assert plan.step("layers.0.queries").out_width == 64  # the layer input resumes after kv_a
    assert plan.step("layers.0.queries").output_channels == ("layers.0.latent",)
    assert plan.step("layers.0.pack").input_channels == ("layers.0.latent",)
    kinds = {s.type for s in plan.steps}
    assert {"LatentAttention", "ConcatExtraInput", "SwapExtraInput"} <= kinds


def test_a_latent_that_disagrees_across_its_channel_is_named(tmp_path: Path) -> None:
    """The pack step expects a 40-wide tail (kv_lora_rank 32 + 8) where kv_a made 48."""
    analysis = _with_block(tmp_path, {"kv_a": {"out_features": 48}})
    errors = _errors(analysis)
    (message,) = [m for k, m in errors.items() if k.endswith("ops[8].extra_inputs.tail [channel-width]")]
    assert "has width 48" in message and "'layers[0-1].pack' takes tail_features=40" in message


def test_an_attention_core_of_another_shape_is_a_width_mismatch(tmp_path: Path) -> None:
    analysis = _with_block(tmp_path, {"attn": {"kv_lora_rank": 16}})
    errors = _errors(analysis)
    assert any(k.endswith("[width-mismatch]") for k in errors), errors


def test_every_knob_is_checked_at_once() -> None:
    analysis = ta.load("deepseek_v3_tiny", ["model.dims.topk_group=5", "model.dims.qk_rope_dim=7"])
    messages = " | ".join(d.message for d in analysis.errors)
    assert "group_topk <= num_groups" in messages
    assert "qk_rope_dim to be a multiple of 2" in messages
    unknown = ta.load("deepseek_v3_tiny", ["model.dims.rope_type=ntk"])
    assert any("rope_type must be one of default, linear, llama3, yarn" in d.message for d in unknown.errors)


def test_swap_with_another_width_takes_its_value_features(tmp_path: Path) -> None:
    """SwapExtraInput resumes with the kept layer input (64 wide) after the 40-wide kv_a: a wrong
    value_features is named at the channel it reads."""
    analysis = _with_block(tmp_path, {"queries": {"value_features": 40}})
    errors = _errors(analysis)
    (message,) = [m for k, m in errors.items() if k.endswith("ops[4].extra_inputs.value [channel-width]")]
    assert "has width 64" in message and "value_features=40" in message


def test_lora_all_linear_adapts_the_projections_around_the_core() -> None:
    plan = ta.load("deepseek_v3_tiny", ["lora.rank=4"]).checked_plan()
    adapted = {s.name.split(".")[-1] for s in plan.steps if s.type in ("LoRA", "GroupedLoRA")}
    assert {"kv_a_lora", "q_a_lora", "q_b_lora", "proj_lora", "fc1_lora", "shared_fc1_lora"} <= adapted
