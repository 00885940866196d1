"""Values that would change the math silently, or crash a reader, are refused by name at their own line:
implausible norms and RoPE settings in a ``config.json`` (the same bounds as the op catalog's), values of
the wrong shape (a list where a name belongs), integer tensors where float weights belong, a model no
machine could hold, a sampling temperature too small to divide by."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from te_assembly.errors import CheckpointError
from te_assembly.formats.hf import config as hf_config
from te_assembly.formats.hf import reader as hf_reader
from te_assembly.formats.hf.config import HFConfigError, parse_config
from tests.hostile.conftest import clean_failure, user_cli

LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
}


def _written(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data, indent=2))  # json writes inf as Infinity, as Python reads it
    return path


def _refusal(tmp_path: Path, **changes: Any) -> tuple[str, int | None, str]:
    path = _written(tmp_path, {**LLAMA, **changes})
    with pytest.raises(HFConfigError) as caught:
        parse_config(hf_config.read_config(path), path)
    (found,) = [d for d in caught.value.diagnostics if d.is_error]
    assert found.file == str(path)
    return found.path, found.line, found.message


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"rms_norm_eps": 1e300}, "rms_norm_eps"),
        ({"rms_norm_eps": -1e-6}, "rms_norm_eps"),
        ({"rope_theta": float("inf")}, "rope_theta"),
        ({"rope_theta": 1e300}, "rope_theta"),
        ({"rope_scaling": {"rope_type": "linear", "factor": float("inf")}}, "rope_scaling.factor"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 1e300}}, "rope_scaling.factor"),
    ],
    ids=["eps-1e300", "eps-negative", "theta-inf", "theta-1e300", "factor-inf", "factor-1e300"],
)
def test_implausible_math_is_refused_at_its_line_in_config_json(
    changes: dict[str, Any], key: str, tmp_path: Path
) -> None:
    path, line, message = _refusal(tmp_path, **changes)
    assert path == f"config.json:{key}", (path, message)
    text = (tmp_path / "config.json").read_text().splitlines()
    assert line is not None and key.split(".")[-1] in text[line - 1], (line, message)


@pytest.mark.parametrize(
    "changes",
    [
        {"architectures": [["LlamaForCausalLM"]]},
        {"architectures": "LlamaForCausalLM"},
        {"dtype": ["float32"]},
        {"dtype": {"a": 1}},
        {"rope_scaling": "linear"},
        {"rope_scaling": ["linear", 2.0]},
        {"rope_scaling": {"rope_type": ["linear"], "factor": 2.0}},
        {"hidden_size": [32]},
        {"num_attention_heads": "4"},
    ],
    ids=str,
)
def test_values_of_the_wrong_shape_are_refused_not_crashed_on(
    changes: dict[str, Any], tmp_path: Path
) -> None:
    path = _written(tmp_path, {**LLAMA, **changes})
    with pytest.raises(HFConfigError) as caught:
        parse_config(hf_config.read_config(path), path)
    assert all(d.file == str(path) for d in caught.value.diagnostics)


def test_a_list_for_the_number_of_experts_is_refused(tmp_path: Path) -> None:
    mixtral = {**LLAMA, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral"}
    path = _written(tmp_path, {**mixtral, "num_local_experts": [4], "num_experts_per_tok": 2})
    with pytest.raises(HFConfigError, match="num_local_experts"):
        parse_config(hf_config.read_config(path), path)


def test_thousands_of_unknown_fields_are_refused_reading_the_file_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _written(tmp_path, {**LLAMA, **{f"unknown_{i}": i for i in range(3000)}})
    reads = []
    real = hf_reader.read_text  # the reader every config.json refusal is located through
    monkeypatch.setattr(hf_reader, "read_text", lambda *a, **k: reads.append(a) or real(*a, **k))
    data = hf_config.read_config(path)
    with pytest.raises(HFConfigError) as caught:
        parse_config(data, path)
    assert len(caught.value.diagnostics) == 3000
    assert len(reads) <= 1  # the lines of every key found in one pass, not one pass per refusal
    lines = path.read_text().splitlines()
    assert '"unknown_2999"' in lines[caught.value.diagnostics[-1].line - 1]


def test_an_integer_tensor_where_a_weight_belongs_is_refused(hf_llama: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    source = tmp_path / "hf"
    shutil.copytree(hf_llama, source)
    tensors = load_file(source / "model.safetensors")
    name = "model.layers.0.mlp.up_proj.weight"
    tensors[name] = torch.randint(0, 2**30, tensors[name].shape, dtype=torch.int32)
    save_file(tensors, source / "model.safetensors", metadata={"format": "pt"})
    import te_assembly

    with pytest.raises(CheckpointError, match=rf"{name} holds I32 values, not floating-point weights"):
        te_assembly.import_hf(source, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_an_integer_tensor_in_a_pretrained_directory_is_refused(tmp_path: Path) -> None:
    import te_assembly
    from te_assembly.formats.pretrained import _check_fits
    from tests.engines._helpers import build_yaml

    model = build_yaml(
        "name: t\nin_features: 8\nops:\n  - {name: fc, op: Linear, args: {in_features: 8, out_features: 8}}\n"
    )
    weights = {k: v.to(torch.int64) for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match="holds int64 values, not floating-point weights"):
        _check_fits(model.plan, weights, "the file")
    del te_assembly


def test_a_model_no_machine_could_hold_is_found_by_validate(tmp_path: Path) -> None:
    wide = ["model=residual_mlp", "model.dims.hidden=100000000000", "model.dims.ffn=100000000000"]
    done = user_cli(tmp_path, "validate", *wide)
    clean_failure(done, 2, "parameters", "more than any machine or cluster holds", "fc1")
    warned = user_cli(tmp_path, "validate", "model=residual_mlp", "model.dims.ffn=100000000000")
    assert warned.returncode == 0 and "more than one GB200 NVL72 rack holds" in warned.stdout + warned.stderr


def test_a_model_no_single_accelerator_holds_is_said_with_its_number() -> None:
    """A 1.6e12-parameter Linear (3.2 TB in bfloat16): valid, but validate says how large, and where."""
    import te_assembly as ta

    model = {
        "name": "huge",
        "in_features": 1_264_911,
        "ops": [
            {"name": "proj", "op": "Linear", "args": {"in_features": 1_264_911, "out_features": 1_264_911}}
        ],
    }
    analysis = ta.load(model)
    (found,) = [d for d in analysis.diagnostics if d.code == "model-too-large"]
    assert not found.is_error
    assert "1.6e+12 parameters, 3.2 TB in bfloat16 (proj, a Linear, holds 100% of them)" in found.message
    assert "more than one accelerator holds" in found.message
    small = ta.load("residual_mlp")
    assert not [d for d in small.diagnostics if d.code == "model-too-large"]


@pytest.mark.parametrize("temperature", [1e-45, 1e-300, 5e-324])
def test_a_vanishing_temperature_samples_the_most_likely_token(temperature: float) -> None:
    from te_assembly.jobs.generate.job import next_token
    from te_assembly.jobs.generate.settings import GenerateSettings

    logits = torch.tensor([0.5, 3.0, -2.0, 2.9])
    chosen = next_token(logits, GenerateSettings(temperature=temperature), torch.Generator().manual_seed(0))
    assert chosen == 1


WRONG = ["x", [1], {"a": 1}, None, -1, True, 0, 3, 1e300, 1e-300]
"""Values of every JSON type, and numbers that are odd, zero, negative, huge or tiny."""


def _families() -> list[str]:
    from tests.hf.tiny import FAMILIES

    return list(FAMILIES)


@pytest.mark.parametrize("family", _families())
def test_every_field_at_every_depth_is_refused_at_config_json_or_read(
    family: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Each field of a real checkpoint's config.json, and each field of its mappings (rope_parameters),
    set to each of ``WRONG`` in turn: the import either reads it or refuses it with diagnostics at
    config.json (never a block file the import copied, never an unexpected error)."""
    from te_assembly.errors import ConfigError, TeAssemblyError
    from te_assembly.formats.hf.convert import analysis_of, read_spec
    from tests.hf.tiny import make

    folder = make(family, tmp_path_factory.mktemp(family) / "hf")
    base = json.loads((folder / "config.json").read_text())
    paths = [(k,) for k in base] + [(k, j) for k, v in base.items() if isinstance(v, dict) for j in v]
    misplaced = []
    for path in paths:
        for value in WRONG:
            config = json.loads(json.dumps(base))
            node = config
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = value
            (folder / "config.json").write_text(json.dumps(config))
            try:
                analysis_of(read_spec(folder), "fuzzed")
            except ConfigError as exc:  # HFConfigError is one
                if {d.file for d in exc.diagnostics} != {str(folder / "config.json")}:
                    misplaced.append((path, value, [d.format() for d in exc.diagnostics][:2]))
            except TeAssemblyError:
                pass
    assert not misplaced, misplaced[:5]


def _rope_pair(tmp_path: Path, variant: str, **scaling_changes: Any) -> Path:
    """``variant``'s checkpoint whose config.json has rope_scaling beside rope_parameters."""
    from tests.hf.tiny import make

    folder = make(variant, tmp_path / variant)
    config = json.loads((folder / "config.json").read_text())
    params = config.get("rope_parameters") or {}
    scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor")}
    config["rope_scaling"] = {**scaling, **scaling_changes}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("variant", ["deepseek_v3", "gpt_oss"])
def test_rope_scaling_that_disagrees_with_rope_parameters_is_refused(variant: str, tmp_path: Path) -> None:
    """transformers reads rope_scaling when both are there, te_assembly rope_parameters: a config where
    they differ is refused at rope_scaling's line; one where they agree imports."""
    transformers = pytest.importorskip("transformers")
    from te_assembly.formats.hf.convert import read_spec

    agreeing = _rope_pair(tmp_path / "same", variant)
    read_spec(agreeing)
    folder = _rope_pair(tmp_path / "differ", variant, factor=2.0)
    assert transformers.AutoConfig.from_pretrained(folder).rope_parameters["factor"] == 2.0  # theirs
    with pytest.raises(HFConfigError) as caught:
        read_spec(folder)
    (found,) = caught.value.diagnostics
    assert found.path == "config.json:rope_scaling" and "factor" in found.message and found.line is not None


def test_rope_theta_inside_and_beside_rope_parameters_must_agree(tmp_path: Path) -> None:
    path, _, message = _refusal(
        tmp_path, rope_theta=10000.0, rope_parameters={"rope_type": "default", "rope_theta": 500000.0}
    )
    assert path == "config.json:rope_theta" and "disagree" in message


@pytest.mark.parametrize("given", ["default", ["default"], 3])
def test_rope_parameters_that_are_no_mapping_are_refused(given: Any, tmp_path: Path) -> None:
    path, _, message = _refusal(tmp_path, rope_parameters=given)
    assert path == "config.json:rope_parameters" and "expected a mapping" in message
