"""Each file is read and parsed once per load, Hydra never parses a model or recipe file, and nothing
downstream re-derives what an earlier pass computed (the model passes and the recipe check run once)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra._internal.core_plugins.file_config_source import FileConfigSource

import te_assembly
from te_assembly.analysis import analyze as analysis
from te_assembly.analysis import recipes
from te_assembly.cli.main import main as cli_main
from te_assembly.config import source
from te_assembly.engines.target import Target

MODEL = """\
name: mine
in_features: ${model.dims.hidden}
dims: {hidden: 8}
ops:
  - {name: tap, op: MakeExtraOutput, extra_outputs: {out: {channel: res, public: false}}}
  - {name: b, op: Bias, args: {size: "${model.dims.hidden}"}}
  - {name: add, op: AddExtraInput, extra_inputs: {addend: res}}
"""


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Counter[str]]]:
    """Parses by file (ours), files Hydra loads itself, runs of the model passes."""
    seen: dict[str, Counter[str]] = {"parsed": Counter(), "hydra": Counter(), "passes": Counter()}
    parse, hydra_load, passes = source._parse, FileConfigSource.load_config, analysis._model_passes

    def counting_parse(text: str, where: str, kind: str, prefix: str) -> Any:
        seen["parsed"][Path(where).name] += 1
        return parse(text, where, kind, prefix)

    def counting_hydra(self: FileConfigSource, config_path: str) -> Any:
        seen["hydra"][config_path] += 1
        return hydra_load(self, config_path)

    def counting_passes(model: Any, *rest: Any) -> Any:
        seen["passes"]["model"] += 1
        return passes(model, *rest)

    monkeypatch.setattr(source, "_parse", counting_parse)
    monkeypatch.setattr(FileConfigSource, "load_config", counting_hydra)
    monkeypatch.setattr(analysis, "_model_passes", counting_passes)
    source._CACHE.clear()
    yield seen
    source._CACHE.clear()


def _user_model(tmp_path: Path) -> Path:
    folder = tmp_path / "mine" / "model"
    folder.mkdir(parents=True)
    path = folder / "mine.yaml"
    path.write_text(MODEL)
    return path


def test_load_parses_each_file_once_and_hydra_none(counts: dict[str, Counter[str]], tmp_path: Path) -> None:
    path = _user_model(tmp_path)
    analysis_ = te_assembly.load(path, ["model.dims.hidden=16", "recipe=mxfp8"])
    assert analysis_.plan is not None and analysis_.plan.in_features == 16
    assert counts["parsed"] == Counter({"mine.yaml": 1, "mxfp8.yaml": 1, "config.yaml": 1})
    assert not [p for p in counts["hydra"] if p.startswith(("model/", "recipe/"))], counts["hydra"]
    assert counts["passes"]["model"] == 1


def test_an_unchanged_file_is_not_parsed_again_and_a_changed_one_is(
    counts: dict[str, Counter[str]], tmp_path: Path
) -> None:
    path = _user_model(tmp_path)
    te_assembly.load(path)
    te_assembly.load(path, ["model.dims.hidden=4"])  # a sweep's next job: same file
    assert counts["parsed"]["mine.yaml"] == 1
    path.write_text(MODEL.replace("hidden: 8", "hidden: 12") + "\n")
    assert te_assembly.load(path).plan.in_features == 12  # type: ignore[union-attr]
    assert counts["parsed"]["mine.yaml"] == 2


@pytest.mark.parametrize("command", ["validate", "graph", "explain"])
def test_cli_parses_once_and_runs_the_passes_once(
    counts: dict[str, Counter[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    path = _user_model(tmp_path)
    extra = [f"graph.out_dir={tmp_path / 'g'}"] if command == "graph" else []
    # An invalid model too: graph draws it and used to validate it twice.
    for overrides in ([], ["model.ops.1.args.size=3"]):
        counts["parsed"].clear()
        counts["passes"].clear()
        code = cli_main([command, "-cd", str(path.parent.parent), "model=mine", *overrides, *extra])
        assert code == (0 if not overrides else 2), capsys.readouterr().err
        assert counts["parsed"]["mine.yaml"] <= 1  # 0 when the cache already holds it
        assert counts["passes"]["model"] == 1
    assert not [p for p in counts["hydra"] if p.startswith(("model/", "recipe/"))]
    capsys.readouterr()


def test_a_config_dir_holding_models_is_not_loaded_by_hydra(
    counts: dict[str, Counter[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _user_model(tmp_path)
    (path.parent / "other.yaml").write_text(MODEL.replace("mine", "other"))
    assert cli_main(["validate", "-cd", str(path.parent.parent), "model=other"]) == 0
    assert counts["parsed"]["other.yaml"] == 1 and counts["parsed"]["mine.yaml"] == 0
    assert not [p for p in counts["hydra"] if p.startswith("model/")]
    capsys.readouterr()


@pytest.mark.te
def test_a_te_build_checks_the_recipe_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = Counter[str]()
    validate = recipes.validate_recipe

    def counting(cfg: Any, prefix: str = "recipe") -> Any:
        calls["validate_recipe"] += 1
        return validate(cfg, prefix)

    monkeypatch.setattr(recipes, "validate_recipe", counting)
    monkeypatch.setattr(analysis, "validate_recipe", counting)
    te_assembly.build("channel_demo", Target.of("te", kernels="te", device="cpu"))
    assert calls["validate_recipe"] == 1  # in the analysis; the TE builder takes the checked recipe
    plan = te_assembly.load("channel_demo").checked_plan()
    calls.clear()
    te_assembly.build(plan, Target.of("te", kernels="te", device="cpu", recipe=recipes.load_recipe("bf16")))
    assert calls["validate_recipe"] == 1  # a recipe given as a mapping: checked once, in build()
