"""``python -m te_assembly validate`` end to end: exit codes, located diagnostics, no tracebacks."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable

import pytest

from te_assembly.config import available_models, config_dir

RunCli = Callable[..., subprocess.CompletedProcess[str]]


def _line_of(model: str, pattern: str) -> int:
    """1-based line of the first line of configs/model/<model>.yaml matching ``pattern``."""
    lines = (config_dir() / "model" / f"{model}.yaml").read_text().splitlines()
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
        ("recipe=nope", "recipe/nope"),
    ],
    ids=["bad-override-syntax", "unknown-top-level-key", "unknown-recipe"],
)
def test_composition_error_is_one_clean_message(run_cli: RunCli, override: str, fragment: str) -> None:
    result = run_cli(["validate", "model=moe_block", override])
    _assert_clean_failure(result)
    assert result.stderr.startswith("error:")
    assert fragment in result.stderr


def test_config_error_is_located_in_the_model_file(run_cli: RunCli) -> None:
    result = run_cli(["validate", "model=moe_block", "model.ops.4.args.num_groups=3", "+model.descripton=x"])
    _assert_clean_failure(result)
    path = config_dir() / "model" / "moe_block.yaml"
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
