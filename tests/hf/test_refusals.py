"""What import and export refuse, and how: every config.json field te_assembly cannot express is named
with its value and what is supported; a checkpoint that disagrees with its config, or a corrupt shard,
is named; a failed import leaves nothing behind; a model with no Hugging Face equivalent names the step."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import te_assembly
from te_assembly.engines.target import Target
from te_assembly.errors import CheckpointError, ResourceError
from te_assembly.formats.hf.config import HFConfigError
from te_assembly.formats.hf.convert import from_hf, import_hf, read_spec, to_hf
from te_assembly.formats.hf.layout import UnexportableError
from tests.hf.tiny import make


def _with_config(source: Path, tmp_path: Path, **changes: object) -> Path:
    """A copy of ``source`` whose config.json has ``changes`` (None deletes a key)."""
    out = tmp_path / "edited"
    out.mkdir()
    for f in source.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    config = json.loads((source / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


@pytest.mark.parametrize(
    ("variant", "changes", "field", "words"),
    [
        (
            "llama",
            {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
            "rope_parameters",
            "dynamic",
        ),
        ("llama", {"hidden_act": "gelu"}, "hidden_act", "silu"),
        ("qwen2", {"use_sliding_window": True}, "use_sliding_window", "sliding"),
        ("llama", {"partial_rotary_factor": 0.5}, "partial_rotary_factor", "1.0"),
        # as transformers 5 writes it: inside rope_parameters, never ignored there either
        (
            "llama",
            {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
            "rope_parameters",
            "partial_rotary_factor = 0.5: supported: 1.0",
        ),
        # GLM-4.5 reads it in either place; two that disagree are refused, not one picked
        (
            "glm4_moe",
            {
                "partial_rotary_factor": 0.5,
                "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25},
            },
            "partial_rotary_factor",
            "disagree",
        ),
        ("mixtral", {"router_jitter_noise": 0.1}, "router_jitter_noise", "jitter"),
        ("qwen3_moe", {"mlp_only_layers": [1]}, "mlp_only_layers", "every layer"),
        ("llama", {"attention_dropout": 0.1}, "attention_dropout", "dropout"),
        ("llama", {"pretraining_tp": 2}, "pretraining_tp", "1"),
        ("llama", {"some_new_knob": 3}, "some_new_knob", "does not know"),
        ("qwen2", {"layer_types": ["full_attention", "sliding_attention"]}, "layer_types", "full_attention"),
    ],
)
def test_an_inexpressible_field_is_refused_by_name(
    variant: str,
    changes: dict[str, object],
    field: str,
    words: str,
    hf_dir: Callable[[str], Path],
    tmp_path: Path,
) -> None:
    folder = _with_config(hf_dir(variant), tmp_path, **changes)
    with pytest.raises(HFConfigError) as info:
        read_spec(folder)
    found = [d for d in info.value.diagnostics if d.path == f"config.json:{field}"]
    assert found, [d.format() for d in info.value.diagnostics]
    assert words in found[0].message
    assert found[0].file == str(folder / "config.json") and found[0].line is not None
    assert not (tmp_path / "dest").exists()


def test_every_refusal_at_once_with_a_hint(hf_dir: Callable[[str], Path], tmp_path: Path) -> None:
    folder = _with_config(
        hf_dir("llama"), tmp_path, hidden_act="relu", rms_norm_epsilon=1e-5, pretraining_tp=4
    )
    with pytest.raises(HFConfigError) as info:
        read_spec(folder)
    paths = {d.path for d in info.value.diagnostics}
    assert {"config.json:hidden_act", "config.json:rms_norm_epsilon", "config.json:pretraining_tp"} <= paths
    typo = next(d for d in info.value.diagnostics if d.path == "config.json:rms_norm_epsilon")
    assert typo.hint is not None and "rms_norm_eps" in typo.hint


def test_an_unknown_architecture_is_refused_with_the_families(
    hf_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    folder = _with_config(hf_dir("llama"), tmp_path, architectures=["LlamaForCausalLm"])
    with pytest.raises(HFConfigError) as info:
        read_spec(folder)
    (d,) = info.value.diagnostics
    assert "MixtralForCausalLM" in d.message and d.hint is not None and "LlamaForCausalLM" in d.hint


def test_the_cli_exits_2_naming_the_field_and_writes_nothing(
    hf_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    folder = _with_config(hf_dir("mistral"), tmp_path, hidden_act="gelu_new")
    dest = tmp_path / "dest"
    done = subprocess.run(
        [sys.executable, "-m", "te_assembly", "import-hf", str(folder), str(dest)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "config.json:hidden_act" in done.stderr + done.stdout and "gelu_new" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr
    assert not dest.exists() and not list(tmp_path.glob(".dest*"))


def test_a_tensor_that_disagrees_with_config_json_is_named(
    hf_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    folder = _with_config(hf_dir("qwen2"), tmp_path, intermediate_size=40)
    with pytest.raises(
        CheckpointError, match=r"model\.layers\.0\.mlp\.gate_proj\.weight has shape \(48, 32\)"
    ):
        import_hf(folder, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


@pytest.mark.parametrize("cut", [100, 7])
def test_a_truncated_shard_is_a_clear_error_and_leaves_nothing(cut: int, tmp_path: Path) -> None:
    source = make("llama", tmp_path / "src", max_shard_size="20KB")
    shards = sorted(source.glob("model-*.safetensors"))
    last = shards[-1]
    last.write_bytes(last.read_bytes()[: max(cut, 1)] if cut < 10 else last.read_bytes()[:-cut])
    with pytest.raises(CheckpointError, match="corrupt or truncated") as info:
        import_hf(source, tmp_path / "dest")
    assert last.name in str(info.value)
    assert not (tmp_path / "dest").exists() and not list(tmp_path.glob(".dest*"))


def test_a_shard_the_index_names_but_is_missing(tmp_path: Path) -> None:
    source = make("llama", tmp_path / "src", max_shard_size="20KB")
    victim = sorted(source.glob("model-*.safetensors"))[0]
    victim.unlink()
    with pytest.raises(CheckpointError, match=f"{victim.name} is missing"):
        import_hf(source, tmp_path / "dest")


def test_an_extra_tensor_is_named_not_dropped(hf_dir: Callable[[str], Path], tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    folder = _with_config(hf_dir("llama"), tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.layers.0.self_attn.q_norm.weight"] = torch.ones(8)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"q_norm\.weight is not part of a LlamaForCausalLM"):
        import_hf(folder, tmp_path / "dest")


def test_the_memory_estimate_checks_the_target_first(
    hf_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TE_ASSEMBLY_MEMORY_LIMIT", "1000")
    with pytest.raises(ResourceError, match="Nothing was allocated"):
        from_hf(hf_dir("llama"), Target.of("reference", device="cpu"))


def test_a_model_with_no_hugging_face_equivalent_names_its_step(tmp_path: Path) -> None:
    model = te_assembly.build("moe_lm", "reference")
    with pytest.raises(UnexportableError) as info:
        to_hf(model, tmp_path / "out")
    assert info.value.step == "layers.0.dispatch" and "align=16" in str(info.value)
    assert not (tmp_path / "out").exists()


def test_a_different_activation_is_named(hf_dir: Callable[[str], Path], tmp_path: Path) -> None:
    pretrained = import_hf(hf_dir("llama"), tmp_path / "llama")
    block = pretrained / "block" / "llama_layer.yaml"
    block.write_text(block.read_text().replace("op: SwiGLU", "op: GEGLU"))
    model = te_assembly.build(te_assembly.load("llama", config_dirs=[pretrained]), "reference")
    with pytest.raises(UnexportableError, match=r"layers\.0\.act.*GEGLU.*SwiGLU"):
        to_hf(model, tmp_path / "out")


def test_non_finite_weights_are_not_exported(hf_dir: Callable[[str], Path], tmp_path: Path) -> None:
    model = from_hf(hf_dir("qwen3"), "reference")
    with torch.no_grad():
        model.state_dict()["steps.final_norm.weight"][3] = float("nan")
    with pytest.raises(Exception, match=r"NaN|non-finite|inf"):
        to_hf(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_what_the_family_cannot_say_is_named_not_dropped(tmp_path: Path) -> None:
    """A Mistral (sliding window) with q/k/v biases: Mistral's config has no field for them, so the
    export names the qkv step rather than writing a checkpoint without its biases."""
    model = te_assembly.build(te_assembly.load("mistral_tiny", ["model.dims.qkv_bias=true"]), "reference")
    with pytest.raises(UnexportableError) as info:
        to_hf(model, tmp_path / "out")
    assert info.value.step == "layers.0.qkv" and "bias=True" in str(info.value)


@pytest.mark.parametrize("variant", ["glm4_moe", "deepseek_v3"])
def test_multi_token_prediction_layers_are_refused_by_name_then_left_out_knowingly(
    variant: str, tmp_path: Path
) -> None:
    """GLM-4.5's and DeepSeek-V3's Hub checkpoints carry multi-token prediction layers after the
    decoder's (``num_nextn_predict_layers``): refused by name, imported without them only when the user
    says so (recorded as ignored), and never silently: their tensors are not read."""
    from safetensors.torch import load_file, save_file

    folder = make(variant, tmp_path / "glm")
    config = json.loads((folder / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1
    (folder / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(folder / "model.safetensors"))
    last = config["num_hidden_layers"] - 1
    extra = {
        k.replace(f"model.layers.{last}.", f"model.layers.{last + 1}."): v.clone()
        for k, v in tensors.items()
        if k.startswith(f"model.layers.{last}.")
    }
    save_file({**tensors, **extra}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as refused:
        import_hf(folder, tmp_path / "refused")
    message = str(refused.value)
    assert f"model.layers.{last + 1}." in message and "multi-token prediction" in message
    assert "import_hf.ignore_fields=[num_nextn_predict_layers]" in message
    assert not (tmp_path / "refused").exists()
    out = import_hf(folder, tmp_path / "imported", ignore_fields=["num_nextn_predict_layers"])
    assert "num_nextn_predict_layers" in (out / "config.yaml").read_text()
    model = te_assembly.from_pretrained(out, "reference")
    assert not any(f".{last + 1}." in k for k in model.state_dict())


def test_deepseek_fields_it_cannot_express_are_each_named(
    hf_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    """A plain q_proj (q_lora_rank null), grouped key/value heads, the remote code's softmax scoring or
    greedy choice, FP8-quantized weights and a qk_head_dim that disagrees: all named at once."""
    folder = _with_config(
        hf_dir("deepseek_v3"),
        tmp_path,
        q_lora_rank=None,
        num_key_value_heads=2,
        scoring_func="softmax",
        topk_method="greedy",
        qk_head_dim=16,
        quantization_config={"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
    )
    with pytest.raises(HFConfigError) as refused:
        read_spec(folder)
    named = {d.path.removeprefix("config.json:"): d.message for d in refused.value.diagnostics}
    assert set(named) == {
        "q_lora_rank",
        "num_key_value_heads",
        "scoring_func",
        "topk_method",
        "qk_head_dim",
        "quantization_config",
    }
    assert "q_a_proj" in named["q_lora_rank"] and "dequantize" in named["quantization_config"]
