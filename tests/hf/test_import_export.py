"""Import to a pretrained directory and export back: what transformers loads agrees with te_assembly;
the public name table maps both ways; a model trained from an import round-trips; shards either way."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import te_assembly
from te_assembly.engines.target import Target
from te_assembly.formats.hf.convert import (
    export_hf,
    from_hf,
    from_hf_state_dict,
    import_hf,
    to_hf,
    to_hf_state_dict,
)
from te_assembly.jobs.verify_hf import float64_islands_removed, load_transformers
from tests.hf.tiny import FAMILIES, make, token_ids, transformers

pytestmark = pytest.mark.slow


def _hf_logits(folder: Path, ids: torch.Tensor) -> torch.Tensor:
    """transformers' float64 logits (its float32 islands removed: compare.py says why)."""
    model = load_transformers(folder, torch.float64)
    with torch.no_grad(), float64_islands_removed(model):
        return model(ids).logits


@pytest.mark.parametrize(
    "variant",
    [*FAMILIES, "llama-tied-mqa", "llama-rope-llama3", "qwen2_moe-norm-topk", "qwen3_moe-rope-yarn-mscale"],
)
def test_import_then_export_loads_in_transformers_with_equal_logits(
    variant: str, hf_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    source = hf_dir(variant)
    pretrained = import_hf(source, tmp_path / "imported")
    model = te_assembly.from_pretrained(pretrained, Target.of("reference", dtype=torch.float64))
    ids = token_ids()
    with torch.no_grad():
        mine = model(ids).y
    torch.testing.assert_close(mine, _hf_logits(source, ids), rtol=0, atol=1e-10)
    exported = to_hf(model, tmp_path / "exported")
    assert {"config.json", "generation_config.json", "model.safetensors"} <= {
        p.name for p in exported.iterdir()
    }
    torch.testing.assert_close(_hf_logits(exported, ids), mine, rtol=0, atol=1e-10)
    config = json.loads((exported / "config.json").read_text())
    original = json.loads((source / "config.json").read_text())
    assert config["architectures"] == original["architectures"]
    theirs = original.get("rope_parameters") or original.get("rope_scaling") or {"rope_type": "default"}
    ours = config.get("rope_parameters") or config.get("rope_scaling") or {"rope_type": "default"}
    if config.get("partial_rotary_factor", 1.0) != 1.0:  # written beside rope_scaling (GLM-4.5 reads both)
        ours = {**ours, "partial_rotary_factor": config["partial_rotary_factor"]}
    # the scaling comes back as it went
    assert {k: v for k, v in ours.items() if k != "rope_theta"} == {
        k: v for k, v in theirs.items() if k not in ("rope_theta", "type")
    }


@pytest.mark.parametrize(
    ("variant", "blocks"),
    [("qwen3_moe", ["q3_layer"]), ("glm4_moe", ["q3_dense_layer", "q3_layer"])],
)
def test_the_imported_yaml_validates_and_rebuilds_the_same_model(
    variant: str, blocks: list[str], hf_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    """Every block the model uses goes with it (dense first layers under their own copy)."""
    pretrained = import_hf(hf_dir(variant), tmp_path / "q3")
    files = sorted(p.relative_to(pretrained).as_posix() for p in pretrained.rglob("*.yaml"))
    assert files == [*(f"block/{b}.yaml" for b in blocks), "config.yaml", "model/q3.yaml"]
    analysis = te_assembly.load("q3", config_dirs=[pretrained])
    rebuilt = te_assembly.build(analysis, Target.of("reference", dtype=torch.float64))
    saved = te_assembly.from_pretrained(pretrained, Target.of("reference", dtype=torch.float64))
    assert set(rebuilt.state_dict()) == set(saved.state_dict())
    rebuilt.load_state_dict(saved.state_dict())
    ids = token_ids()
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(ids).y, saved(ids).y, rtol=0, atol=0)
    assert (pretrained / "hf_config.json").is_file()


@pytest.mark.parametrize("variant", ["qwen2_moe", "glm4_moe", "deepseek_v3", "gpt_oss"])
def test_state_dict_mapping_is_public_and_inverts(variant: str, hf_dir: Callable[[str], Path]) -> None:
    """Every tensor of the checkpoint (GLM-4.5's expert bias buffer included) comes back equal."""
    source = hf_dir(variant)
    model = from_hf(source, Target.of("reference", dtype=torch.float64))
    hf_state = to_hf_state_dict(model)
    from safetensors import safe_open

    with safe_open(str(source / "model.safetensors"), "pt") as f:
        hub = {k: f.get_tensor(k).double() for k in f.keys()}
    assert set(hf_state) == set(hub)
    for name, tensor in hub.items():
        assert torch.equal(hf_state[name], tensor), name
    back = from_hf_state_dict(model, hf_state)
    mine = model.state_dict()
    assert set(back) == set(mine)
    assert all(torch.equal(back[k], mine[k]) for k in mine)
    # any dict keyed like the state dict maps the same way: gradients
    grads = {k: torch.full_like(v, i) for i, (k, v) in enumerate(mine.items())}
    mapped = to_hf_state_dict(model, grads)
    if variant in ("glm4_moe", "deepseek_v3"):
        assert torch.equal(
            mapped["model.layers.1.mlp.gate.e_score_correction_bias"],
            grads["steps.layers.0.router.expert_bias"],
        )
    if variant == "deepseek_v3":  # the latent's norm and expansion, parameters of the attention step
        assert torch.equal(
            mapped["model.layers.1.self_attn.kv_b_proj.weight"], grads["steps.layers.0.attn.kv_b_weight"]
        )
        assert torch.equal(
            mapped["model.layers.0.self_attn.kv_a_layernorm.weight"],
            grads["steps.dense_layers.0.attn.kv_norm_weight"],
        )
    if variant == "gpt_oss":  # expert 1's fc1: the stored tensor's odd columns are its up rows
        hub = mapped["model.layers.1.mlp.experts.gate_up_proj"]
        fc1 = grads["steps.layers.1.fc1.weight1"]
        ffn = fc1.shape[0] // 2
        assert torch.equal(hub[1][:, 1::2], fc1[ffn:].T) and torch.equal(hub[1][:, 0::2], fc1[:ffn].T)
        assert torch.equal(mapped["model.layers.0.self_attn.sinks"], grads["steps.layers.0.attn.sinks"])
    if variant != "qwen2_moe":
        return
    assert torch.equal(
        mapped["model.layers.0.mlp.shared_expert_gate.weight"], grads["steps.layers.0.shared_gate.weight"]
    )


def test_the_stacked_expert_layout_imports_too(hf_dir: Callable[[str], Path], tmp_path: Path) -> None:
    """transformers 5 keeps Mixtral's experts stacked (mlp.experts.gate_up_proj [E, 2F, H]); a checkpoint
    saved in that layout imports to the same model as the Hub's per-expert one."""
    source = hf_dir("mixtral")
    model = transformers.AutoModelForCausalLM.from_pretrained(source)
    stacked = tmp_path / "stacked"
    stacked.mkdir()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    save_file(state, str(stacked / "model.safetensors"), metadata={"format": "pt"})
    (stacked / "config.json").write_text((source / "config.json").read_text())
    a = from_hf(source, Target.of("reference", dtype=torch.float64)).state_dict()
    b = from_hf(stacked, Target.of("reference", dtype=torch.float64)).state_dict()
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_sharded_in_and_out(tmp_path: Path) -> None:
    source = make("llama", tmp_path / "src", max_shard_size="20KB")
    assert (source / "model.safetensors.index.json").is_file()
    model = from_hf(source, Target.of("reference", dtype=torch.float64))
    out = to_hf(model, tmp_path / "out", max_shard_bytes=30_000)
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) > 2 and (out / "model.safetensors.index.json").is_file()
    ids = token_ids()
    with torch.no_grad():
        torch.testing.assert_close(_hf_logits(out, ids), model(ids).y, rtol=0, atol=1e-10)


@pytest.mark.parametrize("variant", ["mixtral", "deepseek_v3", "gpt_oss"])
def test_trained_import_round_trips(variant: str, tmp_path: Path) -> None:
    """import -> train a few steps from the imported weights (train.init_from) -> export -> transformers
    loads it and agrees with the trained model, whose weights moved away from the import's."""
    from te_assembly.jobs.train.settings import TrainSettings

    source = make(
        variant, tmp_path / "src", changes={"vocab_size": 272}
    )  # the byte-level tokenizer's 257 ids fit
    pretrained = import_hf(source, tmp_path / "mix")
    analysis = te_assembly.load("mix", config_dirs=[pretrained])
    settings = TrainSettings(
        steps=3,
        lr=1e-2,
        warmup_steps=0,
        checkpoint_every=0,
        plot=False,
        loggers=[],
        out_dir=str(tmp_path / "run"),
        init_from=str(pretrained),
        batch_tokens=64,
        seq_len=16,
    )
    data = te_assembly.DataSettings(path=str(Path(te_assembly.__file__)))
    result = te_assembly.train(
        analysis.checked_plan(), Target.of("reference", dtype=torch.float64), settings, data=data
    )
    assert any("started from the weights" in n for n in result.notes)
    out = export_hf(tmp_path / "run", tmp_path / "hf-out")
    trained = te_assembly.from_checkpoint(tmp_path / "run", Target.of("reference", dtype=torch.float64))
    start = te_assembly.from_pretrained(pretrained, Target.of("reference", dtype=torch.float64))
    ids = token_ids(vocab=272)
    with torch.no_grad():
        mine = trained(ids).y
        assert not torch.allclose(mine, start(ids).y)
    torch.testing.assert_close(_hf_logits(out, ids), mine, rtol=0, atol=1e-10)


SHIPPED = {
    "llama_tiny": "LlamaForCausalLM",
    "mistral_tiny": "MistralForCausalLM",
    "qwen2_tiny": "Qwen2ForCausalLM",
    "qwen3_tiny": "Qwen3ForCausalLM",
    "mixtral_tiny": "MixtralForCausalLM",
    "qwen2_moe_tiny": "Qwen2MoeForCausalLM",
    "qwen3_moe_tiny": "Qwen3MoeForCausalLM",
    "glm4_moe_tiny": "Glm4MoeForCausalLM",
    "deepseek_v3_tiny": "DeepseekV3ForCausalLM",
    "gpt_oss_tiny": "GptOssForCausalLM",
}


@pytest.mark.parametrize(("name", "architecture"), sorted(SHIPPED.items()))
def test_each_shipped_family_model_exports_to_its_family(
    name: str, architecture: str, tmp_path: Path
) -> None:
    torch.manual_seed(3)
    model = te_assembly.build(name, Target.of("reference", dtype=torch.float64))
    with torch.no_grad():  # norms and biases away from 1 and 0, so a dropped one would show
        for key, value in model.state_dict().items():
            if key.endswith(("norm.weight", "sinks")) or "norm_weight" in key or re.search(r"bias\d*$", key):
                value.add_(torch.randn_like(value) * 0.2)
    out = to_hf(model, tmp_path / name)
    assert json.loads((out / "config.json").read_text())["architectures"] == [architecture]
    ids = token_ids(vocab=272)
    with torch.no_grad():
        torch.testing.assert_close(_hf_logits(out, ids), model(ids).y, rtol=0, atol=1e-10)
    again = from_hf(out, Target.of("reference", dtype=torch.float64))
    assert all(torch.equal(again.state_dict()[k], v) for k, v in model.state_dict().items())


def _with_mtp_tensors(folder: Path, layers: int) -> None:
    """Add a multi-token prediction layer's tensors after the decoder's, as the Hub's GLM-4.5 and
    DeepSeek-V3 checkpoints hold them (transformers saves none)."""
    from safetensors.torch import load_file

    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    hidden = tensors["model.embed_tokens.weight"].shape[1]
    for name, shape in (
        ("eh_proj.weight", (hidden, 2 * hidden)),
        ("enorm.weight", (hidden,)),
        ("hnorm.weight", (hidden,)),
    ):
        tensors[f"model.layers.{layers}.{name}"] = torch.randn(shape)
    save_file(tensors, str(path), metadata={"format": "pt"})


@pytest.mark.parametrize("variant", ["glm4_moe", "deepseek_v3"])
def test_a_declared_mtp_layer_is_read_from_the_tensors_the_checkpoint_holds(
    variant: str, tmp_path: Path
) -> None:
    """transformers' own default (num_nextn_predict_layers 1, no tensor of it saved) imports and equals
    transformers; the same checkpoint holding only part of that module (three of its tensors) is refused
    naming what is missing and the way out, which imports it (and verifies it) without them. (A whole
    module imports: tests/hf/test_mtp.py.)"""
    from te_assembly.errors import CheckpointError
    from te_assembly.jobs.verify_hf import compare, verify_hf

    folder = make(variant, tmp_path / "hf", changes={"num_nextn_predict_layers": 1})
    config = json.loads((folder / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 1
    target = Target.of("reference", dtype=torch.float64)
    result = compare(
        from_hf(folder, target).train(), load_transformers(folder, torch.float64).train(), token_ids()
    )
    assert result.within(1e-10)
    _with_mtp_tensors(folder, config["num_hidden_layers"])
    with pytest.raises(CheckpointError) as refused:
        te_assembly.import_hf(folder, tmp_path / "refused")
    message = str(refused.value)
    layers = config["num_hidden_layers"]
    assert f"missing model.layers.{layers}.input_layernorm.weight" in message
    assert "eh_proj" not in message  # what is there is not claimed missing
    assert "import_hf.ignore_fields=[num_nextn_predict_layers]" in message
    assert not (tmp_path / "refused").exists()
    te_assembly.import_hf(folder, tmp_path / "kept", ignore_fields=["num_nextn_predict_layers"])
    report = verify_hf(folder, target, ignore_fields=["num_nextn_predict_layers"])
    assert report.passed


def test_a_declared_mtp_layer_without_tensors_is_said_in_one_line(tmp_path: Path) -> None:
    """import-hf and verify hf= say, once, that config.json's MTP layer is not in the checkpoint (as
    transformers saves and loads it); a checkpoint that declares none gets no such line."""
    from tests.conftest import user_cli

    make("deepseek_v3", tmp_path / "mtp", changes={"num_nextn_predict_layers": 1})
    make("deepseek_v3", tmp_path / "plain")
    line = "config.json declares 1 multi-token prediction layer(s) (num_nextn_predict_layers)"
    for folder, expected in (("mtp", 1), ("plain", 0)):
        imported = user_cli(tmp_path, "import-hf", folder, f"{folder}_te")
        verified = user_cli(tmp_path, "verify", f"hf={folder}", "dtype=float64")
        for done in (imported, verified):
            assert done.returncode == 0, done.stdout + done.stderr
            assert done.stdout.count(line) == expected, done.stdout
            assert done.stdout.count("multi-token") == expected
