"""Hostile and odd inputs on the command line and in ``build()``: terminal control characters never
reach the terminal, and the config cases that used to crash are clean config errors (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import te_assembly
from te_assembly.cli.main import main as cli_main
from te_assembly.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]

# YAML's "\e" is ESC: a clear-screen, a window-title sequence and a bidi override in names.
NASTY = r"""
name: "evil\e]0;pwned\a\e[2J"
in_features: 4
ops:
  - name: tap
    op: MakeExtraOutput
    extra_outputs: {out: {channel: "tap\e[31m\u202e", public: true}}
  - name: add
    op: AddExtraInput
    extra_inputs: {addend: "tap\e[31m\u202e"}
"""


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "COLUMNS": "400", "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "te_assembly", *args], cwd=cwd, env=env, capture_output=True, timeout=300
    )


@pytest.mark.parametrize(
    ("command", "extra"),
    [
        ("validate", []),
        ("explain", []),
        ("graph", ["graph.out_dir=g"]),
        ("validate", ["model.ops.1.extra_inputs.addend=\x1b[2Jtap"]),
    ],
)
def test_control_characters_in_names_are_escaped_wherever_printed(
    tmp_path: Path, command: str, extra: list[str]
) -> None:
    (tmp_path / "nasty.yaml").write_text(NASTY)
    done = _cli(tmp_path, command, "model=nasty.yaml", *extra)
    assert done.returncode == (2 if extra and "addend" in extra[0] else 0), done.stderr  # an override, too
    printed = done.stdout + done.stderr
    for raw in (b"\x1b", b"\x07", "\u202e".encode()):
        assert raw not in printed
    assert b"\\x1b" in printed


def test_recipe_null_means_no_quantization(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["validate", "model=channel_demo", "recipe=null"]) == 0
    analysis = te_assembly.load("channel_demo", ["recipe=null"])
    assert analysis.plan is not None and analysis.recipe is None
    capsys.readouterr()


def test_model_null_is_a_config_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["validate", "model=null"]) == 2
    assert "no model is chosen" in capsys.readouterr().err


def test_device_mps_is_a_config_time_error_that_lists_the_devices(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["validate", "device=mps"]) == 2
    assert "device must be one of auto, cpu, cuda, cuda:N, got 'mps'" in capsys.readouterr().err


def test_build_rejects_duplicate_keys_as_the_cli_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("name: dup\nin_features: 4\nops: [{name: a, op: Identity}]\nin_features: 8\n")
    with pytest.raises(ConfigError) as caught:
        te_assembly.build(path, "reference")
    [diag] = caught.value.diagnostics
    assert (diag.code, diag.path, diag.file, diag.line) == (
        "duplicate-key",
        "model.in_features",
        str(path),
        4,
    )
    assert cli_main(["validate", f"model={path}"]) == 2
    assert diag.format() in capsys.readouterr().err


@pytest.mark.parametrize("bad", [None, 5, 3.5])
def test_build_refuses_what_is_not_a_config(bad: object) -> None:
    with pytest.raises(TypeError, match="a model name"):
        te_assembly.build(bad, "reference")  # type: ignore[arg-type]


def test_build_of_a_file_with_a_syntax_error_reports_only_that(tmp_path: Path) -> None:
    path = tmp_path / "my model, v2.yaml"  # a name Hydra's override grammar needs quoted
    path.write_text("name: x\nin_features: 8\nops:\n  - name: a\n    op: Bias\n   args: {size: 8}\n")
    with pytest.raises(ConfigError) as caught:
        te_assembly.build(path, "reference")
    assert [(d.code, d.file, d.line) for d in caught.value.diagnostics] == [("yaml-syntax", str(path), 6)]
    path.write_text("name: x\nin_features: 8\nops:\n  - {name: a, op: Bias, args: {size: 8}}\n")
    assert te_assembly.build(str(path), "reference").plan.name == "x"
