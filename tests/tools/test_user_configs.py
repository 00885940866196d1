"""A user's own models, recipes and primary config, kept outside the repository and named by path or by
folder (``-cd``): first class, with the same file:line diagnostics as shipped ones. Every command runs
from a directory outside the repository, as a new user's would."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import user_cli

MODEL = """\
# a user's block
name: my_block
in_features: ${model.dims.hidden}
dims: {hidden: 16}
ops:
  - name: tap
    op: MakeExtraOutput
    extra_outputs: {out: {channel: res, public: false}}
  - name: bias
    op: Bias
    args: {size: "${model.dims.hidden}"}
  - name: scale
    op: ConstantScale
    args: {scale: 0.5}
  - name: add
    op: AddExtraInput
    extra_inputs: {addend: res}
"""
RECIPE = "name: my_fp8\nkind: DelayedScaling\namax_history_len: 16\nfp8_format: HYBRID\n"


@pytest.fixture
def user(tmp_path: Path) -> Path:
    """A working directory with the user's folder ``mine/`` (``model/``, ``recipe/``)."""
    (tmp_path / "mine" / "model").mkdir(parents=True)
    (tmp_path / "mine" / "recipe").mkdir()
    (tmp_path / "mine" / "model" / "my_block.yaml").write_text(MODEL)
    (tmp_path / "mine" / "recipe" / "my_fp8.yaml").write_text(RECIPE)
    return tmp_path


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return user_cli(cwd, *args)


def _line(text: str, pattern: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), start=1) if re.search(pattern, line))


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout


def _fails(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    return done.stderr


def test_model_and_recipe_by_path(user: Path) -> None:
    out = _ok(_cli(user, "validate", "model=mine/model/my_block.yaml", "recipe=./mine/recipe/my_fp8.yaml"))
    assert f"my_block ({user / 'mine' / 'model' / 'my_block.yaml'}): valid — 4 steps" in out


def test_model_and_recipe_by_folder(user: Path) -> None:
    out = _ok(_cli(user, "validate", "-cd", "mine", "model=my_block", "recipe=my_fp8"))
    assert "my_block (" in out and "valid" in out
    cfg = _ok(_cli(user, "validate", "--cfg", "job", "-cd", "mine", "model=my_block", "recipe=my_fp8"))
    assert "amax_history_len: 16" in cfg and "name: my_block" in cfg


def test_available_lists_include_the_users(user: Path) -> None:
    err = _fails(_cli(user, "validate", "-cd", "mine", "model=my_blok"))
    assert "unknown model 'my_blok' (did you mean 'my_block'?)" in err
    assert re.search(r"available models: .*moe_block.*my_block", err, re.DOTALL)
    err = _fails(_cli(user, "validate", "-cd", "mine", "recipe=my_fp9"))
    assert "did you mean 'my_fp8'?" in err and re.search(r"available recipes: .*mxfp8, my_fp8", err)
    out = _ok(_cli(user, "validate", "--help", "-cd", "mine"))
    assert re.search(r"model: .*my_block", out, re.DOTALL) and re.search(r"recipe: .*my_fp8", out, re.DOTALL)


def test_a_missing_path_is_one_clear_error(user: Path) -> None:
    err = _fails(_cli(user, "validate", "model=mine/model/nope.yaml"))
    assert err.startswith("error: model file not found: mine/model/nope.yaml")


def test_errors_in_a_users_model_have_file_and_line(user: Path) -> None:
    path = user / "mine" / "model" / "my_block.yaml"
    path.write_text(
        MODEL.replace("args: {scale: 0.5}", "args: {scale: .nan}").replace("addend: res}", "addend: ress}")
    )
    err = _fails(_cli(user, "validate", "-cd", "mine", "model=my_block", "model.ops.1.args.size=8"))
    text = path.read_text()
    size, scale, addend = (_line(text, p) for p in (r"size:", r"scale: \.nan", r"addend: ress"))
    assert f"{path}:{size}: error: model.ops[1].args.size: Bias step 'bias' has size=8" in err
    assert f"{path}:{scale}: error: model.ops[2].args.scale: scale must be a finite" in err
    assert f"{path}:{addend}: error: model.ops[3].extra_inputs.addend:" in err
    assert "3 error(s)" in err


def test_a_syntax_error_in_a_users_model_is_a_syntax_error(user: Path) -> None:
    path = user / "mine" / "model" / "my_block.yaml"
    path.write_text(MODEL.replace("    op: Bias\n", "    op: Bias\n   oops: 1\n"))
    for args in (["-cd", "mine", "model=my_block"], ["model=mine/model/my_block.yaml"]):
        err = _fails(_cli(user, "validate", *args))
        assert re.match(rf"{re.escape(str(path))}:(1[0-2]): error: model: YAML syntax error: ", err), err
        assert "unknown model" not in err


def test_a_syntax_error_in_a_users_recipe_is_a_syntax_error(user: Path) -> None:
    path = user / "mine" / "recipe" / "my_fp8.yaml"
    path.write_text(RECIPE.replace("amax_history_len: 16", "amax_history_len: [16"))
    err = _fails(_cli(user, "validate", "-cd", "mine", "recipe=my_fp8"))
    assert re.match(rf"{re.escape(str(path))}:\d+: error: recipe: YAML syntax error: ", err), err
    assert "unknown recipe" not in err and "did you mean" not in err


def test_errors_in_a_users_recipe_have_file_and_line(user: Path) -> None:
    path = user / "mine" / "recipe" / "my_fp8.yaml"
    path.write_text(RECIPE.replace("fp8_format: HYBRID", "fp8_format: HYBRD"))
    err = _fails(_cli(user, "validate", "-cd", "mine", "recipe=my_fp8"))
    line = _line(path.read_text(), "fp8_format")
    assert (
        f"{path}:{line}: error: recipe.fp8_format: fp8_format must be one of E4M3, HYBRID, got 'HYBRD'" in err
    )


def test_a_users_primary_config_is_located_too(user: Path) -> None:
    experiment = user / "mine" / "experiment.yaml"
    experiment.write_text("defaults:\n  - config\n  - _self_\n\nseed: -3\nrun:\n  steps: 0\n")
    err = _fails(_cli(user, "validate", "-cd", "mine", "-cn", "experiment"))
    assert f"{experiment}:5: error: seed: seed must be between 0 and 2**63-1, got -3" in err
    assert f"{experiment}:7: error: run.steps: steps must be positive, got 0" in err
    experiment.write_text("defaults:\n  - config\n  - _self_\nseed: [1\n")
    err = _fails(_cli(user, "validate", "-cd", "mine", "-cn", "experiment"))
    assert re.match(rf"{re.escape(str(experiment))}:\d+: error: config: YAML syntax error", err), err


def test_run_and_graph_a_users_model(user: Path) -> None:
    out = _ok(
        _cli(user, "run", "-cd", "mine", "model=my_block", "engine=reference", "run.steps=1", "run.tokens=4")
    )
    assert "engine reference: loss" in out
    _ok(_cli(user, "graph", "-cd", "mine", "model=my_block", "graph.out_dir=g", "graph.formats=[mermaid]"))
    assert (user / "g" / "my_block.mmd").read_text().startswith("flowchart LR")
