"""PEFT adapters through the one schema and the one safetensors opener: every ``adapter_config.json``
field te_assembly reads is checked by type and range (named as the file's field, never as a setting),
every PEFT field that changes what the adapters compute is refused by name, and the tensors must be
complete, float and of the shapes the base and the rank need. Each refusal is one ``CheckpointError``
before anything is written: an import with a bad adapter leaves no directory behind."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import te_assembly
from te_assembly.errors import CheckpointError
from te_assembly.formats.adapters import PEFT_REFUSED
from tests.hostile.conftest import clean_failure, user_cli

peft = pytest.importorskip("peft", reason="adapters as PEFT writes them need peft (the dev extras)")


def _peft_adapter(base: Path, out: Path) -> Path:
    """An adapter exactly as PEFT saves it (its defaults), on ``base``."""
    from te_assembly.jobs.verify_hf import load_transformers

    model = peft.get_peft_model(
        load_transformers(base, torch.float32),
        peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def adapter(hf_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _peft_adapter(hf_llama, tmp_path_factory.mktemp("adapter") / "peft")


def _edited(adapter: Path, tmp_path: Path, **changes: object) -> Path:
    out = tmp_path / "edited"
    shutil.copytree(adapter, out)
    config = json.loads((out / "adapter_config.json").read_text())
    config.update(changes)
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out


def _refused(hf: Path, adapter: Path, tmp_path: Path, *words: str) -> str:
    with pytest.raises(CheckpointError) as caught:
        te_assembly.import_hf(hf, tmp_path / "dest", adapter=adapter)
    message = str(caught.value)
    for word in words:
        assert word in message, (word, message)
    assert not (tmp_path / "dest").exists() and not list(tmp_path.glob(".dest*"))
    return message


def test_the_adapter_as_peft_saves_it_imports(hf_llama: Path, adapter: Path, tmp_path: Path) -> None:
    """The baseline of every case below: PEFT's own file, its defaults included, is accepted."""
    out = te_assembly.import_hf(hf_llama, tmp_path / "dest", adapter=adapter)
    assert (out / "model.safetensors").is_file()


SETTINGS = {
    "layers_to_transform": [0],
    "layers_pattern": "layers",
    "layer_replication": [[0, 1], [0, 1]],
    "alora_invocation_tokens": [5, 6],
    "rank_pattern": {"q_proj": 2},
    "alpha_pattern": {"v_proj": 3},
    "modules_to_save": ["lm_head"],
    "exclude_modules": ["v_proj"],
    "target_parameters": ["mlp.experts.gate_up_proj"],
    "trainable_token_indices": [3],
    "lora_bias": True,
    "use_qalora": True,
    "fan_in_fan_out": True,
}


@pytest.mark.parametrize("field", sorted(PEFT_REFUSED))
def test_every_peft_field_that_changes_the_computation_is_refused_by_name(
    field: str, hf_llama: Path, adapter: Path, tmp_path: Path
) -> None:
    _refused(
        hf_llama, _edited(adapter, tmp_path, **{field: SETTINGS[field]}), tmp_path, field, "not supported"
    )


def test_each_refused_field_has_a_case() -> None:
    assert set(SETTINGS) == set(PEFT_REFUSED)


BAD_VALUES = {
    "use_dora not a flag": ({"use_dora": "yes"}, 'use_dora = "yes"'),
    "lora_alpha null": ({"lora_alpha": None}, "lora_alpha = null"),
    "lora_alpha zero": ({"lora_alpha": 0}, "lora_alpha = 0"),
    "r zero": ({"r": 0}, "r = 0"),
    "r as text": ({"r": "4"}, 'r = "4"'),
    "r fractional": ({"r": 4.5}, "r = 4.5"),
    "dropout of one": ({"lora_dropout": 1.0}, "lora_dropout = 1.0"),
    "rslora as text": ({"use_rslora": "yes"}, 'use_rslora = "yes"'),
    "targets as a pattern": ({"target_modules": "all-linear"}, 'target_modules = "all-linear"'),
    "no targets": ({"target_modules": []}, "target_modules = []"),
    "a bias": ({"bias": "all"}, 'bias = "all"'),
    "a field nobody knows": ({"lora_quantum": 3}, "lora_quantum = 3"),
    "another kind of adapter": ({"peft_type": "IA3"}, 'peft_type = "IA3"'),
}


@pytest.mark.parametrize("case", BAD_VALUES, ids=list(BAD_VALUES))
def test_a_bad_value_is_named_as_the_file_s_field(
    case: str, hf_llama: Path, adapter: Path, tmp_path: Path
) -> None:
    changes, words = BAD_VALUES[case]
    message = _refused(
        hf_llama, _edited(adapter, tmp_path, **changes), tmp_path, "adapter_config.json", words
    )
    assert "lora.alpha" not in message and "Traceback" not in message


def test_every_problem_of_the_file_is_named_at_once(hf_llama: Path, adapter: Path, tmp_path: Path) -> None:
    edited = _edited(adapter, tmp_path, lora_alpha=None, r=-1, lora_bias=True)
    _refused(hf_llama, edited, tmp_path, "lora_alpha = null", "r = -1", "lora_bias")


def _tensors(adapter: Path, tmp_path: Path, change: Callable[[dict[str, torch.Tensor]], None]) -> Path:
    from safetensors.torch import load_file, save_file

    out = tmp_path / "edited"
    shutil.copytree(adapter, out)
    tensors = load_file(str(out / "adapter_model.safetensors"))
    change(tensors)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    return out


def _first(tensors: dict[str, torch.Tensor], kind: str) -> str:
    return sorted(k for k in tensors if f"lora_{kind}" in k)[0]


def _integer(t: dict[str, torch.Tensor]) -> None:
    t[_first(t, "A")] = t[_first(t, "A")].to(torch.int32)


def _transposed(t: dict[str, torch.Tensor]) -> None:
    t[_first(t, "A")] = t[_first(t, "A")].T.contiguous()


def _another_rank(t: dict[str, torch.Tensor]) -> None:
    for name in list(t):
        t[name] = torch.cat([t[name], t[name]], dim=0 if "lora_A" in name else 1)


def _missing(t: dict[str, torch.Tensor]) -> None:
    del t[_first(t, "B")]


def _not_finite(t: dict[str, torch.Tensor]) -> None:
    t[_first(t, "B")][0, 0] = float("nan")


TENSOR_CASES = {
    "a NaN": (_not_finite, "NaN or inf"),
    "an integer tensor": (_integer, "not a float"),
    "a transposed tensor": (_transposed, "has shape"),
    "another rank than the config's": (_another_rank, "another rank"),
    "a tensor missing": (_missing, "has no"),
}


@pytest.mark.parametrize("case", TENSOR_CASES, ids=list(TENSOR_CASES))
def test_the_tensors_are_complete_floats_of_the_needed_shapes(
    case: str, hf_llama: Path, adapter: Path, tmp_path: Path
) -> None:
    change, words = TENSOR_CASES[case]
    _refused(hf_llama, _tensors(adapter, tmp_path, change), tmp_path, "adapter_model.safetensors", words)


def test_an_adapter_made_for_another_base_is_refused(hf_llama: Path, tmp_path: Path) -> None:
    from tests.hf.tiny import make

    other = make("llama", tmp_path / "other", changes={"hidden_size": 48})
    _refused(hf_llama, _peft_adapter(other, tmp_path / "theirs"), tmp_path, "another base")


@pytest.mark.parametrize("cut", [4, 60])
def test_a_truncated_adapter_file_is_a_clean_error(
    cut: int, hf_llama: Path, adapter: Path, tmp_path: Path
) -> None:
    edited = tmp_path / "edited"
    shutil.copytree(adapter, edited)
    weights = edited / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:cut])
    _refused(hf_llama, edited, tmp_path, "adapter_model.safetensors", "corrupt or truncated")


def test_the_command_line_says_it_in_one_line_and_writes_nothing(
    hf_llama: Path, adapter: Path, tmp_path: Path
) -> None:
    edited = _edited(adapter, tmp_path, lora_alpha=None)
    done = user_cli(tmp_path, "import-hf", str(hf_llama), "dest", f"import_hf.adapter={edited}")
    clean_failure(done, 1, "adapter_config.json", "lora_alpha = null")
    assert not (tmp_path / "dest").exists()


def test_a_rank_the_base_cannot_hold_is_named_as_the_file_s_field(
    hf_llama: Path, adapter: Path, tmp_path: Path
) -> None:
    """r = 1000 on 32-wide projections: said of adapter_config.json's r, not of a setting the user never
    wrote (``lora.rank``)."""
    message = _refused(
        hf_llama, _edited(adapter, tmp_path, r=1000), tmp_path, "adapter_config.json", "r = 1000"
    )
    assert "does not fit" in message and "wider than" in message and "lora.rank" not in message
