"""``python -m te_assembly validate`` end to end: exit codes, located diagnostics, no tracebacks."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable

import pytest

from te_assembly.config import available_models, configs_dir

RunCli = Callable[..., subprocess.CompletedProcess[str]]


def _line_of(model: str, pattern: str) -> int:
    """1-based line of the first line of configs/model/<model>.yaml matching ``pattern``."""
    lines = (configs_dir() / "model" / f"{model}.yaml").read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if re.search(pattern, line))


def _assert_clean_failure(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout


def test_unknown_model_lists_models_and_suggests(run_cli: RunCli) -> None:
    result = run_cli(["validate", "model=moe_blok"])
    _assert_clean_failure(result)
    assert "unknown model 'moe_blok'" in result.stderr
    assert "did you mean 'moe_block'?" in result.stderr
    for name in available_models():
        assert name in result.stderr


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("model.ops[0]=x=y", "model.ops[0]=x=y"),  # not Hydra override grammar
        ("nosuchkey=1", "'nosuchkey'"),  # a top-level key the config does not have
        ("recipe=nope", "unknown recipe 'nope'\navailable recipes: bf16, "),
        ("recipe=mxfp9", "unknown recipe 'mxfp9' (did you mean 'mxfp8'?)"),
    ],
    ids=["bad-override-syntax", "unknown-top-level-key", "unknown-recipe", "misspelled-recipe"],
)
def test_composition_error_is_one_clean_message(run_cli: RunCli, override: str, fragment: str) -> None:
    result = run_cli(["validate", "model=moe_block", override])
    _assert_clean_failure(result)
    assert result.stderr.startswith("error:")
    assert fragment in result.stderr


def test_config_error_is_located_in_the_model_file(run_cli: RunCli) -> None:
    result = run_cli(["validate", "model=moe_block", "model.ops.4.args.num_groups=3", "+model.descripton=x"])
    _assert_clean_failure(result)
    path = configs_dir() / "model" / "moe_block.yaml"
    # Both errors, in file order: the added key is not in the file, so it points at the model's first
    # key; the overridden one at the line of its key in the shipped YAML.
    found = re.findall(r"^(.*?):(\d+): error: (\S+):", result.stderr, flags=re.M)
    assert found == [
        (str(path), str(_line_of("moe_block", r"^[a-z_]+:")), "model.descripton"),
        (str(path), str(_line_of("moe_block", r"num_groups:.*experts")), "model.ops[4].args.num_groups"),
    ]
    assert "did you mean 'description'?" in result.stderr
    assert "set num_groups: 4" in result.stderr
    assert "2 error(s)" in result.stderr


def test_bad_interpolation_override_is_located(run_cli: RunCli) -> None:
    result = run_cli(["validate", "model=moe_block", "model.dims.hidden=${model.dims.nope}"])
    _assert_clean_failure(result)
    line = _line_of("moe_block", r"^\s+hidden:")
    expected = rf":{line}: error: model\.dims\.hidden: cannot resolve value: .*model\.dims\.nope"
    assert re.search(expected, result.stderr), result.stderr


def test_unknown_command_suggests(run_cli: RunCli) -> None:
    result = run_cli(["validat", "model=moe_block"])
    _assert_clean_failure(result)
    assert "did you mean 'validate'?" in result.stderr


@pytest.mark.parametrize(
    ("overrides", "suggestion", "listed"),
    [
        (
            ["model.ops.4.args.num_group=4"],
            "did you mean 'model.ops.4.args.num_groups'?",
            "model.ops.4.args has: in_features, num_groups, out_features",
        ),
        (
            ["recipe=fp8_delayed", "recipe.amax_histroy_len=16"],
            "did you mean 'recipe.amax_history_len'?",
            "amax_compute_algo, amax_history_len",
        ),
        (["modle.dims.hidden=3"], "did you mean 'model.dims.hidden'?", "the config root has: bench"),
    ],
    ids=["step-arg", "recipe-field", "top-level"],
)
def test_mistyped_override_key_suggests_existing_keys(
    run_cli: RunCli, overrides: list[str], suggestion: str, listed: str
) -> None:
    result = run_cli(["validate", "model=moe_block", *overrides])
    _assert_clean_failure(result)
    assert "Could not override" in result.stderr
    assert suggestion in result.stderr
    assert listed in result.stderr


@pytest.mark.parametrize("value", ["[LayerNorm]", "{name: LayerNorm}", "5"], ids=["list", "mapping", "int"])
def test_op_that_is_not_a_name_is_one_clean_error(run_cli: RunCli, value: str) -> None:
    result = run_cli(["validate", "model=residual_mlp", f"model.ops.1.op={value}"])
    _assert_clean_failure(result)
    assert re.findall(r"error: (\S+): ", result.stderr) == ["model.ops[1].op"], result.stderr
    assert "1 error(s)" in result.stderr
