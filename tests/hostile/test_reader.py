"""One bounded reader for every file a user can point at: each attack on it, against every surface that
reads through it. A FIFO, a device, a socket or a directory is refused by its type (never opened, so
never waited on); a file over its kind's limit by its size (a sparse 64 GiB file costs no disk); a
symlink out of the folder a file was found in, naming where it leads. Every refusal is te_assembly's own
typed error naming the file, raised before the surface reads anything else."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from te_assembly.errors import ConfigError, TeAssemblyError
from tests.hostile.conftest import READ_ATTACKS, deep_json, not_utf8


@dataclass(frozen=True)
class Surface:
    """Where a user points te_assembly at a file: ``prepare`` makes the folder around it (the file itself
    is left to the attack) and returns the path to attack; ``read`` does what the command does."""

    file: str
    prepare: Callable[[Path], Path]
    read: Callable[[Path, Path], object]
    found_in_folder: bool
    """The file is found in a folder the user gave (a checkpoint's files), not named by its own path:
    a symlink out of that folder is refused. A file named by its own path may be a link anywhere."""
    limited: bool = True
    """The file has a size limit (a shard has none: checkpoints are as large as models)."""
    folders_allowed: bool = False
    """A folder of that name is one more folder of data, not an attack."""


def _folder(name: str) -> Callable[[Path], Path]:
    def prepare(tmp: Path) -> Path:
        folder = tmp / "given"
        folder.mkdir()
        return folder / name

    return prepare


def _hf_checkpoint_with(name: str) -> Callable[[Path], Path]:
    """A real (tiny) Hugging Face checkpoint folder whose ``name`` is the attack."""

    def prepare(tmp: Path) -> Path:
        from tests.hf.tiny import make

        folder = make("llama", tmp / "given")
        if name == "model-00001-of-00002.safetensors":  # a shard the index names
            (folder / "model.safetensors").unlink()
            index = {"weight_map": {"model.embed_tokens.weight": name}}
            (folder / "model.safetensors.index.json").write_text(json.dumps(index))
        elif (folder / name).exists():
            (folder / name).unlink()
        return folder / name

    return prepare


def _analyze(path: Path, folder: Path) -> object:
    from te_assembly.analysis.pipeline import load

    analysis = load(None, [f"model={path}"])
    errors = [d for d in analysis.diagnostics if d.is_error]
    if errors:
        raise ConfigError(errors)
    return analysis


def _found_model(path: Path, folder: Path) -> object:
    from te_assembly.analysis.pipeline import load

    root = folder.parent
    analysis = load(None, ["model=mine"], config_dirs=[str(root)])
    errors = [d for d in analysis.diagnostics if d.is_error]
    if errors:
        raise ConfigError(errors)
    return analysis


def _prepare_found_model(tmp: Path) -> Path:
    (tmp / "configs" / "model").mkdir(parents=True)
    return tmp / "configs" / "model" / "mine.yaml"


def _read_spec(path: Path, folder: Path) -> object:
    from te_assembly.formats.hf.convert import read_spec

    return read_spec(folder)


def _shards(path: Path, folder: Path) -> object:
    from te_assembly.formats.hf.shards import HFCheckpoint

    with HFCheckpoint(folder) as checkpoint:
        return len(checkpoint)


def _companions(path: Path, folder: Path) -> object:
    from te_assembly.formats.companions import read_companions

    return read_companions(folder)


def _imported_companions(path: Path, folder: Path) -> object:
    from te_assembly.formats.companions import read_companions
    from te_assembly.formats.hf.convert import IMPORTED_COMPANIONS

    return read_companions(folder, IMPORTED_COMPANIONS)


def _ls_show(path: Path, folder: Path) -> object:
    from te_assembly.cli.commands import ls

    return ls._text(path)


def _generate_tokenizer(path: Path, folder: Path) -> object:
    from te_assembly.jobs.generate.job import tokenizer_for
    from te_assembly.jobs.generate.settings import GenerateSettings

    return tokenizer_for(folder, GenerateSettings())


def _prompt(path: Path, folder: Path) -> object:
    from te_assembly.jobs.generate.job import read_prompt
    from te_assembly.jobs.generate.settings import GenerateSettings

    return read_prompt(GenerateSettings(prompt_file=str(path)))


def _data_folder(path: Path, folder: Path) -> object:
    from te_assembly.data.settings import DataSettings
    from te_assembly.data.sources import documents, find_sources

    (folder / "a.txt").write_text("ordinary text\n")
    settings = DataSettings(path=str(folder))
    return list(documents(find_sources(settings), settings))


def _data_file(path: Path, folder: Path) -> object:
    from te_assembly.data.settings import DataSettings
    from te_assembly.data.sources import documents, find_sources

    settings = DataSettings(path=str(path))
    return list(documents(find_sources(settings), settings))


def _tokenizer_setting(path: Path, folder: Path) -> object:
    from te_assembly.data.tokenizer import load_tokenizer_file

    return load_tokenizer_file(path, "<|endoftext|>")


def _pretrained_config(path: Path, folder: Path) -> object:
    import te_assembly

    (folder / "model.safetensors").write_bytes(b"")
    return te_assembly.from_pretrained(folder, "reference")


def _adapter_folder(name: str) -> Callable[[Path], Path]:
    """A PEFT adapter folder (its adapter_config.json valid) whose ``name`` is the attack."""

    def prepare(tmp: Path) -> Path:
        folder = tmp / "given"
        folder.mkdir()
        if name != "adapter_config.json":
            config = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}
            (folder / "adapter_config.json").write_text(json.dumps(config))
        return folder / name

    return prepare


def _peft_adapter(path: Path, folder: Path) -> object:
    from te_assembly.formats.adapters import read_peft

    return read_peft(folder)


def _pretrained_weights(tmp: Path) -> Path:
    """A pretrained directory te_assembly wrote, its weights file the attack."""
    import te_assembly
    from tests.engines._helpers import build_yaml

    model = (
        "name: tiny\nin_features: 8\nops:\n"
        "  - {name: fc, op: Linear, args: {in_features: 8, out_features: 8}}\n"
    )
    folder = te_assembly.save_pretrained(build_yaml(model), tmp / "given")
    (folder / "model.safetensors").unlink()
    return folder / "model.safetensors"


def _pretrained(path: Path, folder: Path) -> object:
    import te_assembly

    return te_assembly.from_pretrained(folder, "reference")


SURFACES = {
    "model file (model=PATH)": Surface("m.yaml", _folder("m.yaml"), _analyze, False),
    "model file found by name (-cd)": Surface("mine.yaml", _prepare_found_model, _found_model, True),
    "config.json (import-hf, from_hf)": Surface(
        "config.json", _hf_checkpoint_with("config.json"), _read_spec, True
    ),
    "shard index (import-hf)": Surface(
        "model.safetensors.index.json", _hf_checkpoint_with("model.safetensors.index.json"), _shards, True
    ),
    "shard (import-hf)": Surface(
        "model-00001-of-00002.safetensors",
        _hf_checkpoint_with("model-00001-of-00002.safetensors"),
        _shards,
        True,
        limited=False,
    ),
    "tokenizer_config.json (import-hf, export)": Surface(
        "tokenizer_config.json", _folder("tokenizer_config.json"), _companions, True
    ),
    "tokenizer.json (import-hf)": Surface(
        "tokenizer.json", _folder("tokenizer.json"), _imported_companions, True
    ),
    "a config ls shows": Surface("shown.yaml", _folder("shown.yaml"), _ls_show, True),
    "tokenizer.json beside a model (generate)": Surface(
        "tokenizer.json", _folder("tokenizer.json"), _generate_tokenizer, True
    ),
    "generate.prompt_file": Surface("prompt.txt", _folder("prompt.txt"), _prompt, False),
    "a text file in data.path": Surface("b.txt", _folder("b.txt"), _data_folder, True, folders_allowed=True),
    "data.path=FILE": Surface("c.txt", _folder("c.txt"), _data_file, False, folders_allowed=True),
    "data.tokenizer.path": Surface("tok.json", _folder("tok.json"), _tokenizer_setting, False),
    "adapter_config.json (import_hf.adapter, with_adapter)": Surface(
        "adapter_config.json", _adapter_folder("adapter_config.json"), _peft_adapter, True
    ),
    "adapter_model.safetensors (import_hf.adapter, with_adapter)": Surface(
        "adapter_model.safetensors",
        _adapter_folder("adapter_model.safetensors"),
        _peft_adapter,
        True,
        limited=False,
    ),
    "a pretrained directory's model.safetensors": Surface(
        "model.safetensors", _pretrained_weights, _pretrained, True, limited=False
    ),
    "a pretrained directory's config.yaml": Surface(
        "config.yaml", _folder("config.yaml"), _pretrained_config, True
    ),
}

CASES = [
    pytest.param(surface, attack, id=f"{attack}-{name}")
    for name, surface in SURFACES.items()
    for attack in READ_ATTACKS
    if (not attack.startswith("symlink-") or surface.found_in_folder)
    and (attack != "too-large" or surface.limited)
    and (attack != "directory" or not surface.folders_allowed)
]


def _refused(surface: Surface, tmp_path: Path, attack: str) -> str:
    path = surface.prepare(tmp_path)
    READ_ATTACKS[attack](path)
    with pytest.raises(TeAssemblyError) as caught:
        surface.read(path, path.parent)
    return str(caught.value)


@pytest.mark.parametrize(("surface", "attack"), CASES)
def test_every_surface_refuses_every_attack_on_the_reader(
    surface: Surface, attack: str, tmp_path: Path
) -> None:
    message = _refused(surface, tmp_path, attack)
    assert surface.file in message, message
    expected = {
        "fifo": ("FIFO",),
        # /dev/zero is reached by a symlink: in a folder, the link out of it may be what is refused
        "device": ("device", "outside"),
        "socket": ("socket",),
        "directory": ("directory",),
        "symlink-out": ("outside",),
        "symlink-sibling": ("outside",),
        "too-large": ("limited to",),
    }[attack]
    assert any(word in message for word in expected), message
    if attack.startswith("symlink-"):
        assert "from elsewhere" not in message  # nothing of the file outside is read, or shown


@pytest.mark.parametrize(
    "surface",
    [SURFACES[n] for n in ("generate.prompt_file", "data.path=FILE", "model file (model=PATH)")],
    ids=["prompt", "data", "model"],
)
def test_a_file_named_by_its_own_path_may_be_a_link_anywhere(surface: Surface, tmp_path: Path) -> None:
    path = surface.prepare(tmp_path)
    elsewhere = tmp_path / "elsewhere" / path.name
    elsewhere.parent.mkdir()
    if path.suffix == ".yaml":
        elsewhere.write_text(
            "name: linked\nin_features: 8\nops:\n"
            "  - {name: fc, op: Linear, args: {in_features: 8, out_features: 8}}\n"
        )
    else:
        elsewhere.write_text("some text the user keeps elsewhere\n")
    path.symlink_to(elsewhere)
    surface.read(path, path.parent)


@pytest.mark.parametrize(
    ("surface", "attack", "words"),
    [
        (SURFACES["config.json (import-hf, from_hf)"], not_utf8, "not UTF-8"),
        (SURFACES["config.json (import-hf, from_hf)"], deep_json, "nested deeper than"),
        (SURFACES["shard index (import-hf)"], deep_json, "nested deeper than"),
        (SURFACES["tokenizer_config.json (import-hf, export)"], deep_json, "nested deeper than"),
        (SURFACES["generate.prompt_file"], not_utf8, "not UTF-8"),
    ],
    ids=["config-utf8", "config-deep", "index-deep", "tokenizer-config-deep", "prompt-utf8"],
)
def test_text_and_json_problems_are_named(
    surface: Surface, attack: Callable[[Path], None], words: str, tmp_path: Path
) -> None:
    path = surface.prepare(tmp_path)
    attack(path)
    with pytest.raises(TeAssemblyError, match=words):
        surface.read(path, path.parent)


def test_a_json_key_given_twice_is_refused_with_its_line(tmp_path: Path) -> None:
    from te_assembly.files.read import InputFileError, read_json

    path = tmp_path / "config.json"
    path.write_text('{\n  "hidden_size": 32,\n  "vocab_size": 8,\n  "hidden_size": 4096\n}\n')
    with pytest.raises(InputFileError, match="'hidden_size' appears twice") as caught:
        read_json(path, limit=1 << 20)
    assert caught.value.line == 4


def test_a_json_lines_record_nested_200000_deep_is_a_data_error(tmp_path: Path) -> None:
    from te_assembly.data.settings import DataSettings
    from te_assembly.data.sources import documents, find_sources
    from te_assembly.errors import DataError

    path = tmp_path / "records.jsonl"
    path.write_text('{"text": "fine"}\n' + "[" * 200_000 + "]" * 200_000 + "\n")
    settings = DataSettings(path=str(path))
    with pytest.raises(DataError, match=r"records\.jsonl:2 .*nested deeper than"):
        list(documents(find_sources(settings), settings))
