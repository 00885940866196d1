"""``te_assembly.testing``'s Python API, the shared composition that keeps a folder of configs fast,
and te_assembly's own configs and invalid corpus checked through the plugin."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from te_assembly.analysis import pipeline
from te_assembly.config.locations import configs_dir
from te_assembly.errors import ConfigCheckError
from te_assembly.testing import Expected, assert_diagnostics, assert_recipe, assert_valid, read_sidecar
from tests.validation import corpus_files
from tests.validation.test_invalid_corpus import CASES

REPO_ROOT = Path(__file__).resolve().parents[2]
CORPUS = corpus_files.FOLDER


def test_assert_valid_passes_and_fails_with_the_diagnostics() -> None:
    analysis = assert_valid("residual_mlp", overrides=["model.dims.hidden=32"])
    assert analysis.plan is not None and analysis.plan.in_features == 32
    with pytest.raises(ConfigCheckError) as info:
        assert_valid(CORPUS / "model" / "dangling-typo.yaml", config_dirs=[CORPUS])
    text = str(info.value)
    assert "does not validate: 1 error(s)" in text
    assert "dangling-typo.yaml:" in text and "model.ops[4].extra_inputs.split_sizes" in text
    assert "(did you mean 'split_sizes'?)" in text
    assert isinstance(info.value, AssertionError)


def test_assert_diagnostics_names_what_is_missing_and_extra() -> None:
    path = CORPUS / "model" / "dangling-typo.yaml"
    right = [{"code": "dangling-input", "path": "model.ops[4].extra_inputs.split_sizes"}]
    assert_diagnostics(path, right, config_dirs=[CORPUS])
    wrong = [{"code": "dangling-input", "path": "model.ops[5].extra_inputs.split_sizes"}]
    with pytest.raises(ConfigCheckError) as info:
        assert_diagnostics(path, wrong, config_dirs=[CORPUS])
    text = str(info.value)
    assert "expected, not reported:\n  error dangling-input at model.ops[5].extra_inputs.split_sizes" in text
    assert "reported, not expected:" in text and "model.ops[4].extra_inputs.split_sizes" in text
    with pytest.raises(ConfigCheckError, match="warning dangling-input"):
        assert_diagnostics(path, [{**right[0], "severity": "warning"}], config_dirs=[CORPUS])
    with pytest.raises(ValueError, match="severity must be one of error, warning"):
        Expected.of({"code": "x", "path": "y", "severity": "fatal"})


def test_assert_recipe() -> None:
    for recipe in (REPO_ROOT / "recipes").glob("*.yaml"):
        assert_recipe(recipe)
    bad = REPO_ROOT / "tests" / "configs" / "corpus-recipes" / "recipe" / "typo_field.yaml"
    with pytest.raises(ConfigCheckError, match="amax_histroy_len"):
        assert_recipe(bad)
    assert_recipe(bad, read_sidecar(bad).diagnostics)


def test_a_folder_composes_once_per_override_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin adds no Hydra start-up per file: one composition for the whole folder, and each file's
    diagnostics exactly as ``load`` gives them."""
    calls: list[list[str]] = []
    real = pipeline._compose

    def counting(overrides: list[str], config_dirs: object) -> object:
        calls.append(overrides)
        return real(overrides, config_dirs)  # type: ignore[arg-type]

    files = sorted(p for p in (CORPUS / "model").glob("*.yaml") if not p.name.endswith(".expect.yaml"))
    pipeline._COMPOSED.clear()
    monkeypatch.setattr(pipeline, "_compose", counting)
    shared = [pipeline.load_model_file(f, config_dirs=[CORPUS]) for f in files]
    assert len(calls) == 1
    pipeline.load_model_file(files[0], ["model.dims.hidden=16"], config_dirs=[CORPUS])
    assert len(calls) == 2  # another override set: composed once more
    for path, analysis in zip(files, shared, strict=True):
        alone = pipeline.load(path, config_dirs=[CORPUS])
        assert [d.format() for d in analysis.diagnostics] == [d.format() for d in alone.diagnostics], path


def test_the_corpus_folder_matches_the_cases() -> None:
    """tests/configs/corpus is CASES written out (``python -m tests.validation.corpus_files`` rewrites it)."""
    folder = CORPUS / "model"
    assert sorted(p.name for p in folder.glob("*.yaml") if not p.name.endswith(".expect.yaml")) == sorted(
        f"{c.id}.yaml" for c in CASES
    )
    for case in CASES:
        path = folder / f"{case.id}.yaml"
        assert path.read_text() == corpus_files.model_text(case), case.id
        assert (folder / f"{case.id}.expect.yaml").read_text() == corpus_files.expect_text(case, path), (
            case.id
        )


def test_our_own_configs_are_collected_through_the_plugin() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "-m", "te_config"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    items = [line for line in done.stdout.splitlines() if "::" in line]
    shipped = {p.stem for p in (configs_dir() / "model").glob("*.yaml")}
    assert {f"configs/model/{m}.yaml::validate" for m in shipped} <= set(items)
    assert "configs/block/moe_layer.yaml::validate" in items
    corpus = {line for line in items if line.startswith("tests/configs/corpus/model/")}
    assert len(corpus) == len(CASES)
    assert "tests/configs/corpus-recipes/recipe/typo_field.yaml::validate" in items


def test_rank_estimate_is_the_fullest_ranks_share() -> None:
    import torch

    from te_assembly.analysis.pipeline import load
    from te_assembly.engines.memory import estimate, rank_estimate

    one = load("moe_block")
    whole = estimate(one.checked_plan(), torch.float32, tokens=256, trained=1, optimizer="adamw")
    assert one.layout is not None
    same = rank_estimate(one.checked_plan(), one.layout, torch.float32, tokens=256, optimizer="adamw")
    assert same == whole  # one process: the whole model, the whole batch
    split = load("moe_block", ["parallel.expert=2", "parallel.data=2"])
    assert split.layout is not None and split.plan is not None
    rank = rank_estimate(split.plan, split.layout, torch.float32, tokens=256, optimizer="adamw")
    expert_params = sum(
        p.numel() for name, p in te_build_params(split.plan).items() if name.startswith("steps.fc")
    )
    assert rank.parameters == whole.parameters - (expert_params // 2) * 4  # half the experts, 4 bytes each
    assert rank.activations < whole.activations  # half the rows per rank


def te_build_params(plan: object) -> dict[str, object]:
    import te_assembly

    return dict(te_assembly.build(plan, "reference").state_dict())  # type: ignore[arg-type]
