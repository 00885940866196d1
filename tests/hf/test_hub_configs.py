"""The ``config.json`` of real Hub checkpoints imports as published: every field is read (math), held to
its one value (``rope_interleaved: false``, ``pretraining_tp: 1``, ``use_sliding_window: false``) or
metadata; the models te_assembly builds from them have transformers' own parameter count (transformers
building the same config on the meta device, no weights); what would change the math is still refused
at its line; an unknown field is refused until ``import_hf.ignore_fields`` names it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from te_assembly.formats.hf.config import HFConfigError, parse_config
from te_assembly.formats.hf.convert import analysis_of, read_spec
from tests.hf.hub_configs import HUB_CONFIGS, OLD_STYLE_FIELDS


def _written(tmp_path: Path, config: dict[str, Any]) -> Path:
    """``config`` as the Hub writes it (two-space JSON, one key a line) in a folder of its own."""
    folder = tmp_path / "checkpoint"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


def _line_of(folder: Path, key: str) -> int:
    lines = (folder / "config.json").read_text().splitlines()
    return next(n for n, line in enumerate(lines, start=1) if line.strip().startswith(f'"{key}"'))


EXPECTED = {
    "meta-llama/Llama-3.2-1B-Instruct": {"tied": True, "head_dim": 64, "rope_type": "llama3"},
    "meta-llama/Llama-3.1-8B-Instruct": {"tied": False, "kv_heads": 8, "rope_type": "llama3"},
    "HuggingFaceTB/SmolLM2-135M-Instruct": {"heads": 9, "kv_heads": 3, "tied": True},
    "mistralai/Mistral-7B-v0.1": {"sliding_window": 4096},
    "mistralai/Mistral-7B-Instruct-v0.3": {"sliding_window": None, "vocab": 32768},
    "Qwen/Qwen2.5-0.5B-Instruct": {"qkv_bias": True, "sliding_window": None, "tied": True},
    "Qwen/Qwen2.5-7B-Instruct": {"qkv_bias": True, "kv_heads": 4},
    "Qwen/Qwen3-0.6B": {"qk_norm": True, "head_dim": 128, "qkv_bias": False},
    "mistralai/Mixtral-8x7B-v0.1": {"experts": 8, "top_k": 2, "pre_softmax": False},
    "Qwen/Qwen1.5-MoE-A2.7B": {"experts": 60, "top_k": 4, "shared_ffn": 5632, "pre_softmax": True},
    "Qwen/Qwen3-30B-A3B": {"experts": 128, "top_k": 8, "pre_softmax": False, "qk_norm": True},
    "microsoft/Phi-3-mini-4k-instruct": {"sliding_window": 2047, "rotary_dim": None, "vocab": 32064},
    "microsoft/Phi-4-mini-instruct": {"rotary_dim": 96, "kv_heads": 8, "tied": True, "vocab": 200064},
    "google/gemma-2-2b-it": {
        "layer_windows": (4096, None) * 13,
        "softmax_scale": 256**-0.5,
        "attn_softcap": 50.0,
        "final_softcap": 30.0,
        "embed_scale": 2304**0.5,
        "tied": True,  # Gemma ties by transformers' default, unwritten
    },
    "google/gemma-2-9b-it": {
        "layer_windows": (4096, None) * 21,
        "softmax_scale": 256**-0.5,  # head_dim 256 too: 9B's scalar is its head width, 27B's is not
        "heads": 16,
        "kv_heads": 8,
        "tied": True,
    },
    "google/gemma-3-1b-it": {
        "layer_windows": ((512,) * 5 + (None,)) * 4 + (512, 512),
        "rope": {"rope_theta": 1000000, "rope_type": "default"},
        "local_rope": {"rope_theta": 10000, "rope_type": "default"},
        "qk_norm": True,
        "attn_softcap": None,
        "final_softcap": None,
    },
    "allenai/OLMo-2-1124-7B": {"qk_norm": True, "tied": False, "vocab": 100352},
}


@pytest.mark.parametrize("repo", sorted(HUB_CONFIGS))
def test_published_config_imports_as_is(repo: str, tmp_path: Path) -> None:
    folder = _written(tmp_path, HUB_CONFIGS[repo])
    spec = read_spec(folder)
    config = HUB_CONFIGS[repo]
    assert spec.architecture == config["architectures"][0]
    assert (spec.hidden, spec.layers, spec.vocab) == (
        config["hidden_size"],
        config["num_hidden_layers"],
        config["vocab_size"],
    )
    for key, value in EXPECTED[repo].items():
        actual = spec.rope["rope_type"] if key == "rope_type" else getattr(spec, key)
        assert actual == value, (repo, key)
    # the token ids and the context length are kept for export, the list of Llama 3's eos ids included
    assert spec.metadata["eos_token_id"] == config["eos_token_id"]
    assert spec.metadata["max_position_embeddings"] == config["max_position_embeddings"]


@pytest.mark.parametrize("repo", sorted(HUB_CONFIGS))
def test_parameter_count_is_transformers_own(repo: str, tmp_path: Path) -> None:
    """The model built from the published config has exactly the parameters transformers' model of the
    same config has (built on the meta device: real sizes, no memory)."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    folder = _written(tmp_path, HUB_CONFIGS[repo])
    with torch.device("meta"):
        reference = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.from_pretrained(folder)
        )
    expected = sum(p.numel() for p in reference.parameters())
    analysis, _ = analysis_of(read_spec(folder), "hub")
    assert analysis.checked_plan().num_params == expected


def test_old_style_generic_fields_are_metadata(tmp_path: Path) -> None:
    """Older transformers wrote every generic ``PretrainedConfig`` field (sampling defaults, encoder-decoder
    flags, label maps) and fine-tunes add ``_model_name_or_path`` and ``unk_token_id``: none is refused."""
    config = {**HUB_CONFIGS["HuggingFaceTB/SmolLM2-135M-Instruct"], **OLD_STYLE_FIELDS}
    spec = read_spec(_written(tmp_path, config))
    assert spec.metadata["unk_token_id"] == 0
    assert "_model_name_or_path" not in spec.metadata  # a name, not kept for export


@pytest.mark.parametrize(
    ("repo", "key", "value", "words"),
    [
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "rope_interleaved", True, "rotate halves"),
        ("meta-llama/Llama-3.1-8B-Instruct", "pretraining_tp", 2, "unsplit"),
        ("meta-llama/Llama-3.1-8B-Instruct", "pretraining_tp", True, "unsplit"),
        ("Qwen/Qwen2.5-7B-Instruct", "use_sliding_window", True, "sliding windows"),
        ("Qwen/Qwen3-30B-A3B", "mlp_only_layers", [0, 47], "every layer"),
        ("Qwen/Qwen3-30B-A3B", "decoder_sparse_step", 2, "every layer"),
        ("microsoft/Phi-4-mini-instruct", "mlp_bias", True, "no bias"),
        ("microsoft/Phi-4-mini-instruct", "lm_head_bias", True, "no bias"),
        ("microsoft/Phi-4-mini-instruct", "full_attn_mod", 2, "every layer attends alike"),
        ("microsoft/Phi-4-mini-instruct", "interpolate_factor", 4, "LongRoPE"),
        ("meta-llama/Llama-3.2-1B-Instruct", "pruned_heads", {"0": [1]}, "pruned"),
        ("meta-llama/Llama-3.2-1B-Instruct", "add_cross_attention", True, "cross-attention"),
    ],
)
def test_math_changing_value_is_refused_at_its_line(
    repo: str, key: str, value: Any, words: str, tmp_path: Path
) -> None:
    folder = _written(tmp_path, {**HUB_CONFIGS[repo], key: value})
    with pytest.raises(HFConfigError) as caught:
        read_spec(folder)
    (found,) = caught.value.diagnostics
    assert found.path == f"config.json:{key}"
    assert words in found.message
    assert found.line == _line_of(folder, key)


def test_unknown_field_is_refused_until_ignored_by_name(tmp_path: Path) -> None:
    config = {**HUB_CONFIGS["Qwen/Qwen2.5-0.5B-Instruct"], "rope_flavour": "spicy", "vision_tower": None}
    folder = _written(tmp_path, config)
    with pytest.raises(HFConfigError) as caught:
        read_spec(folder)
    refused = {d.path: d for d in caught.value.diagnostics}
    assert set(refused) == {"config.json:rope_flavour", "config.json:vision_tower"}
    assert refused["config.json:rope_flavour"].line == _line_of(folder, "rope_flavour")
    assert "import_hf.ignore_fields=[vision_tower]" in (refused["config.json:vision_tower"].hint or "")
    with pytest.raises(HFConfigError) as caught:
        read_spec(folder, ignore_fields=["vision_tower"])
    assert [d.path for d in caught.value.diagnostics] == ["config.json:rope_flavour"]
    spec = read_spec(folder, ignore_fields=["vision_tower", "rope_flavour"])
    assert spec.architecture == "Qwen2ForCausalLM"


def test_ignore_fields_takes_only_unknown_fields_present(tmp_path: Path) -> None:
    """Ignoring a field te_assembly reads would drop its meaning silently; ignoring one the file lacks is a
    typo: both are refused, with the fields named."""
    config = {**HUB_CONFIGS["mistralai/Mistral-7B-v0.1"], "vision_tower": None}
    with pytest.raises(HFConfigError) as caught:
        parse_config(config, Path("config.json"), ignore=["sliding_window", "vision_towr", "vision_tower"])
    refused = {d.path: d for d in caught.value.diagnostics}
    assert set(refused) == {"config.json:sliding_window", "config.json:vision_towr"}
    assert "reads" in refused["config.json:sliding_window"].message
    assert "vision_tower" in (refused["config.json:vision_towr"].hint or "")


def test_ignored_fields_are_recorded_by_import(tmp_path: Path) -> None:
    """``import_hf.ignore_fields`` is recorded in the pretrained directory's ``config.yaml``."""
    import yaml

    from te_assembly.formats.hf.convert import import_hf
    from tests.hf.tiny import make

    source = make("llama", tmp_path / "made")
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "vision_tower": None}, indent=2))
    with pytest.raises(HFConfigError):
        import_hf(source, tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    out = import_hf(source, tmp_path / "imported", ignore_fields=["vision_tower"])
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["hf_ignored_fields"] == ["vision_tower"]


def test_rank_8_adapters_on_a_135m_model_are_a_fraction_of_its_training_memory(tmp_path: Path) -> None:
    """SmolLM2-135M's published config with rank-8 adapters on every projection: PEFT's count of trainable
    parameters (r * (in + out) per adapted module), and ``explain``'s table shows gradients and AdamW state
    at about 1.5% of training every weight."""
    from rich.console import Console

    from te_assembly.analysis.fusions import FusionTarget
    from te_assembly.formats.adapters import adapter_plan
    from te_assembly.views.adapters import adapter_table

    folder = _written(tmp_path, HUB_CONFIGS["HuggingFaceTB/SmolLM2-135M-Instruct"])
    spec = read_spec(folder)
    base = analysis_of(spec, "hub")[0].checked_plan()
    plan = adapter_plan(base, {"rank": 8})
    q, kv = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
    shapes = [(spec.hidden, q), (spec.hidden, kv), (spec.hidden, kv), (q, spec.hidden)]
    shapes += [(spec.hidden, spec.ffn), (spec.hidden, spec.ffn), (spec.ffn, spec.hidden)]
    assert plan.num_trainable_params == spec.layers * sum(8 * (a + b) for a, b in shapes)
    share = plan.num_trainable_params / plan.num_params
    assert 0.01 < share < 0.02
    console = Console(width=200, record=True)
    table = adapter_table(plan, FusionTarget.of(None, recipe=None, dtype="bfloat16"))
    assert table is not None
    console.print(table)
    text = console.export_text()
    assert f"{plan.num_trainable_params:,} of {plan.num_params:,}" in text
    assert f"({100 * share:.2f}%)" in text  # gradients + AdamW state: the same share


def test_glm_4_5_air_as_published_reads_with_its_mtp_layer_declared(tmp_path: Path) -> None:
    """The config declares one multi-token prediction layer: read as declared (whether the checkpoint
    holds its tensors is for the import to find, tests/hf/test_import_export.py), left out knowingly on
    request; the model counts transformers' parameters."""
    from tests.hf.hub_configs import MTP_CONFIGS

    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    config = MTP_CONFIGS["zai-org/GLM-4.5-Air"]
    folder = _written(tmp_path, config)
    assert (read_spec(folder).mtp_layers, read_spec(folder).dropped_layers) == (1, 0)
    spec = read_spec(folder, ["num_nextn_predict_layers"])
    assert (spec.rotary_dim, spec.first_dense, spec.dense_ffn, spec.shared_ffn) == (64, 1, 10944, 1408)
    assert (spec.qkv_bias, spec.o_bias, spec.qk_norm, spec.dropped_layers) == (True, False, False, 1)
    assert spec.router["num_groups"] == 1 and spec.router["scaling_factor"] == 1.0
    with torch.device("meta"):
        reference = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.from_pretrained(folder)
        )
    analysis, _ = analysis_of(spec, "hub")
    plan = analysis.checked_plan()
    assert plan.num_params == sum(p.numel() for p in reference.parameters())
    assert plan.num_params > 100e9  # GLM-4.5-Air: 106B parameters in all


def test_deepseek_v3_as_published_is_refused_by_name_and_its_bf16_copy_imports(tmp_path: Path) -> None:
    """DeepSeek-V3's own config.json: its FP8 weights are named (its multi-token prediction layer is the
    import's to find among the tensors).
    Its bf16 copy (no quantization_config), with the MTP layer left out knowingly, is 671B parameters as
    transformers counts them, with YaRN's factor 40 scaling the softmax by mscale squared."""
    from tests.hf.hub_configs import MTP_CONFIGS

    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    config = MTP_CONFIGS["deepseek-ai/DeepSeek-V3"]
    with pytest.raises(HFConfigError) as refused:
        read_spec(_written(tmp_path, config))
    assert [d.path for d in refused.value.diagnostics] == ["config.json:quantization_config"]
    bf16 = {k: v for k, v in config.items() if k != "quantization_config"}
    (tmp_path / "bf16").mkdir()
    folder = _written(tmp_path / "bf16", bf16)
    spec = read_spec(folder, ["num_nextn_predict_layers"])
    assert spec.mla == {
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_dim": 128,
        "qk_rope_dim": 64,
        "v_head_dim": 128,
        "rope_interleaved": True,
        "attention_bias": False,
    }
    assert (spec.first_dense, spec.dense_ffn, spec.shared_ffn, spec.dropped_layers) == (3, 18432, 2048, 1)
    assert spec.router["num_groups"] == 8 and spec.router["group_topk"] == 4
    assert spec.router["scaling_factor"] == 2.5
    with torch.device("meta"):
        hub = transformers.AutoConfig.for_model(
            **{k: v for k, v in bf16.items() if k not in ("auto_map", "architectures")}
        )
        reference = transformers.AutoModelForCausalLM.from_config(hub)
    analysis, _ = analysis_of(spec, "hub")
    plan = analysis.checked_plan()
    assert plan.num_params == sum(p.numel() for p in reference.parameters())
    assert 670e9 < plan.num_params < 672e9
    attention = next(s for s in plan.steps if s.type == "LatentAttention")
    from te_assembly.engines.reference.latent_attention import LatentAttention

    with torch.device("meta"):
        core = LatentAttention(**attention.args)
    assert core.softmax_scale == reference.model.layers[0].self_attn.scaling


def test_gpt_oss_20b_as_published_is_refused_by_name_and_its_bf16_copy_imports(tmp_path: Path) -> None:
    """gpt-oss-20b's own config.json: its MXFP4 experts are named, never misread. Its bf16 copy imports
    as 21B parameters as transformers counts them, one use per layer with its window (sliding, full...),
    sinks on every attention step."""
    from tests.hf.hub_configs import QUANTIZED_CONFIGS

    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    config = QUANTIZED_CONFIGS["openai/gpt-oss-20b"]
    with pytest.raises(HFConfigError) as refused:
        read_spec(_written(tmp_path, config))
    assert [d.path for d in refused.value.diagnostics] == ["config.json:quantization_config"]
    bf16 = {k: v for k, v in config.items() if k != "quantization_config"}
    (tmp_path / "bf16").mkdir()
    spec = read_spec(_written(tmp_path / "bf16", bf16))
    assert spec.layer_windows == (128, None) * 12
    assert spec.clamp == {"swiglu_limit": 7.0, "swiglu_alpha": 1.702}
    assert (spec.experts, spec.top_k, spec.ffn) == (32, 4, 2880)
    with torch.device("meta"):
        hub = transformers.AutoConfig.for_model(**{k: v for k, v in bf16.items() if k != "architectures"})
        reference = transformers.AutoModelForCausalLM.from_config(hub)
    analysis, _ = analysis_of(spec, "hub")
    plan = analysis.checked_plan()
    assert plan.num_params == sum(p.numel() for p in reference.parameters())
    assert 20e9 < plan.num_params < 22e9
    windows = [s.args.get("sliding_window") for s in plan.steps if s.type == "Attention"]
    assert windows == [128, None] * 12
    assert all(s.args.get("sinks") for s in plan.steps if s.type == "Attention")


def test_gpt_oss_twin_fields_that_disagree_are_named(tmp_path: Path) -> None:
    from tests.hf.hub_configs import QUANTIZED_CONFIGS

    config = {k: v for k, v in QUANTIZED_CONFIGS["openai/gpt-oss-20b"].items() if k != "quantization_config"}
    config.update(experts_per_token=2, layer_types=["sliding_attention", "chunked_attention"] * 12)
    with pytest.raises(HFConfigError) as refused:
        read_spec(_written(tmp_path, config))
    named = {d.path.removeprefix("config.json:"): d.message for d in refused.value.diagnostics}
    assert set(named) == {"experts_per_token", "layer_types"}
    assert "chunked_attention" in named["layer_types"]


def test_gemma_2_older_window_name_is_held_to_the_window(tmp_path: Path) -> None:
    """gemma-2-9b-it's ``sliding_window_size`` (an older name the Hub's file carries beside
    ``sliding_window``, which transformers alone reads) is accepted when it says the same, refused at
    its line when it does not (the import would otherwise keep a window nobody applies)."""
    config = {**HUB_CONFIGS["google/gemma-2-9b-it"], "sliding_window_size": 2048}
    with pytest.raises(HFConfigError) as refused:
        read_spec(_written(tmp_path, config))
    (found,) = refused.value.diagnostics
    assert found.path == "config.json:sliding_window_size"
    assert "differs from sliding_window = 4096" in found.message


@pytest.mark.parametrize("old_name", ["su", "yarn"])
def test_phi_3s_older_longrope_names_read_as_transformers_reads_them(old_name: str, tmp_path: Path) -> None:
    """The first Phi-3 128k and Phi-3-vision configs call LongRoPE ``su`` (Phi3Config reads ``su`` and
    ``yarn`` as ``longrope``): the same checkpoint with either name imports and equals transformers in
    float64; the name is Phi-3's alone (a Llama saying ``su`` is still refused)."""
    torch = pytest.importorskip("torch")
    from te_assembly.engines.target import Target
    from te_assembly.formats.hf.convert import from_hf
    from te_assembly.jobs.verify_hf import compare, load_transformers
    from tests.hf.tiny import make, token_ids

    folder = make("phi3-longrope", tmp_path / "phi3")
    config = json.loads((folder / "config.json").read_text())
    key = "rope_parameters" if isinstance(config.get("rope_parameters"), dict) else "rope_scaling"
    config[key] = {k: v for k, v in config[key].items() if k != "type"} | {"rope_type": old_name}
    (folder / "config.json").write_text(json.dumps(config))
    assert read_spec(folder).rope["rope_type"] == "longrope"
    mine = from_hf(folder, Target.of("reference", dtype=torch.float64)).train()
    result = compare(mine, load_transformers(folder, torch.float64).train(), token_ids())
    assert result.within(1e-10)
    llama = {**HUB_CONFIGS["meta-llama/Llama-3.2-1B-Instruct"], "rope_scaling": {"rope_type": "su"}}
    with pytest.raises(HFConfigError, match="rope_type = 'su'"):
        read_spec(_written(tmp_path, llama))
