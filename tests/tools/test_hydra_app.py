"""The command line is a Hydra app: Hydra's flags, sweeps and completion work per command, through a
real ``python -m te_assembly`` process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]


def _cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb", "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "te_assembly", *args],
        cwd=cwd or REPO_ROOT,
        env={**full_env, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _clean(done: subprocess.CompletedProcess[str], code: int = 0) -> None:
    assert done.returncode == code, (done.stdout, done.stderr)
    assert "Traceback" not in done.stdout + done.stderr


def test_cfg_job_shows_the_composed_model_and_recipe() -> None:
    done = _cli(
        "validate", "--cfg", "job", "model=residual_mlp", "model.dims.hidden=32", "recipe=fp8_delayed"
    )
    _clean(done)
    cfg = yaml.safe_load(done.stdout)
    assert "hydra" not in cfg
    assert cfg["model"]["name"] == "residual_mlp" and cfg["model"]["in_features"] == 32
    assert cfg["model"]["ops"][1]["args"]["normalized_shape"] == 32  # interpolations resolved
    assert cfg["recipe"]["kind"] == "DelayedScaling" and cfg["train"]["lr"] == 0.003


def test_cfg_hydra_all_and_package() -> None:
    hydra_only = yaml.safe_load(_cli("validate", "--cfg", "hydra").stdout)
    assert list(hydra_only) == ["hydra"] and hydra_only["hydra"]["job"]["chdir"] is False
    everything = yaml.safe_load(_cli("validate", "--cfg", "all").stdout)
    assert {"hydra", "model", "recipe", "engine"} <= set(everything)
    done = _cli("validate", "--cfg", "job", "--package", "model.dims", "model.dims.ffn=96")
    _clean(done)
    assert done.stdout.startswith("# @package model.dims")
    assert yaml.safe_load(done.stdout)["ffn"] == 96


def test_info_shows_the_search_path_with_a_config_dir(tmp_path: Path) -> None:
    done = _cli("validate", "--info", "searchpath", "-cd", str(tmp_path))
    _clean(done)
    assert f"file://{tmp_path}" in done.stdout


def test_multirun_validates_every_job_and_ends_in_one_table(tmp_path: Path) -> None:
    done = _cli("validate", "-m", "model=residual_mlp,two_stage", cwd=tmp_path)
    _clean(done)
    assert done.stdout.count(": valid —") == 2
    assert "validate sweep: 2 job(s)" in done.stdout
    assert re.search(r"│\s+1 │ model=two_stage\s+│\s+0 │\s+9 │", done.stdout), done.stdout
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun.yaml").exists()


def test_multirun_exits_with_the_worst_jobs_code() -> None:
    done = _cli("validate", "-m", "model=residual_mlp", "model.ops.2.args.in_features=64,7")
    _clean(done, 2)
    rows = re.findall(r"│\s+(\d) │ model\.ops\.2\.args\.in_features=(\d+)\s+│\s+(\d) │", done.stdout)
    assert rows == [("0", "64", "0"), ("1", "7", "2")], done.stdout
    assert "model.ops[2].args.in_features" in done.stderr


def test_a_sweep_without_multirun_says_how() -> None:
    done = _cli("validate", "model.dims.hidden=32,64")
    _clean(done, 2)
    assert "--multirun" in done.stderr


def test_bench_sweep_ends_in_one_comparison_table() -> None:
    done = _cli(
        "bench",
        "-m",
        "model=channel_demo",
        "engine=reference",
        "model.dims.hidden=8,16",
        "bench.repeats=1",
        "bench.warmup=0",
        "bench.tokens=4",
    )
    _clean(done)
    table = done.stdout[done.stdout.index("bench sweep: 2 job(s)") :]
    assert "step ms" in table and "step tokens/s" in table
    assert re.search(r"model\.dims\.hidden=16\s+│\s+0 │.*\(\d+\.\d\dx\)", table), table


def test_shell_completion_installs_and_completes_models(tmp_path: Path) -> None:
    done = _cli("-sc", "install=bash")
    _clean(done)
    assert "complete -o nospace -o default -F hydra_bash_completion te-assembly" in done.stdout
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "my_block.yaml").write_text("name: my_block\n")
    line = f"te-assembly validate -cd {tmp_path} model=m"
    done = _cli("-sc", "query=bash", env={"COMP_LINE": line, "COMP_POINT": str(len(line))})
    _clean(done)
    assert set(done.stdout.split()) == {
        "model=mistral_tiny",
        "model=mixtral_tiny",
        "model=moe_block",
        "model=moe_block_wide",
        "model=moe_lm",
        "model=moe_transformer",
        "model=my_block",
    }


def test_hydra_help_and_version() -> None:
    done = _cli("--hydra-help")
    _clean(done)
    assert "Hydra (" in done.stdout and "--multirun" in done.stdout
    done = _cli("--version")
    _clean(done)
    from te_assembly.version import __version__

    assert done.stdout.startswith(f"te_assembly {__version__} (Hydra 1.3")  # ours first, Hydra's beside it


def test_hydra_verbose_logs_what_was_read() -> None:
    done = _cli("validate", "model=two_stage", "hydra.verbose=true")
    _clean(done)
    assert "[DEBUG]" in done.stderr
    assert re.search(r"te_assembly\.config\.source: read .*two_stage\.yaml", done.stderr), done.stderr
    assert "[DEBUG]" not in _cli("validate", "model=two_stage").stderr


@pytest.mark.parametrize(
    ("command", "rows"),
    [
        ("train", [("train.lr", "0.003", "peak learning rate"), ("engine", "auto", "auto, reference, te")]),
        ("bench", [("bench.tokens", "1024", "rows of x per call"), ("seed", "0", "seeds weights")]),
        ("graph", [("graph.out_dir", "null", "<model>.mmd")]),
        ("validate", [("run.steps", "3", "forward+backward steps"), ("dtype", "float32", "bfloat16")]),
    ],
)
def test_command_help_lists_its_settings(command: str, rows: list[tuple[str, str, str]]) -> None:
    done = _cli(command, "--help")
    _clean(done)
    assert done.stdout.startswith(f"usage: python -m te_assembly {command}")
    for key, value, doc in rows:
        assert re.search(
            rf"^\s*{re.escape(key)}\s+{re.escape(value)}\s+.*{re.escape(doc)}", done.stdout, re.M
        ), key
    shipped = "model: channel_demo, deepseek_v3_tiny, dense_lm, dense_transformer, fanout_mlp, glm4_moe_tiny"
    assert shipped in done.stdout
    assert "--multirun" in done.stdout
    if command not in ("train", "validate"):  # validate checks every section a command reads
        assert "train.lr" not in done.stdout


def test_help_shows_the_values_this_command_line_would_run_with() -> None:
    done = _cli("train", "--help", "train.lr=0.5", "model=two_stage")
    _clean(done)
    assert re.search(r"^\s*train\.lr\s+0\.5\s", done.stdout, re.M)
    assert "(now: two_stage)" in done.stdout


def test_an_unknown_flag_is_exit_2() -> None:
    done = _cli("validate", "--nope")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "unrecognized arguments: --nope" in done.stderr


def test_run_leaves_no_hydra_folders_behind(tmp_path: Path) -> None:
    _clean(_cli("validate", cwd=tmp_path))
    _clean(_cli("run", "model=channel_demo", "engine=reference", "run.steps=1", "run.tokens=4", cwd=tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_help_lists_blocks_as_what_models_use_not_a_choice() -> None:
    done = _cli("validate", "--help")
    _clean(done)
    listed = "blocks, for a model's steps (block: NAME; -cd DIR adds DIR/block/*.yaml): dense_layer"
    assert listed in done.stdout
    assert "\n  block:" not in done.stdout  # not among the groups one chooses with GROUP=NAME


def test_cfg_job_shows_the_blocks_as_read() -> None:
    """--cfg job holds each block the model uses, command-line block overrides applied; -p picks one."""
    done = _cli(
        "validate", "model=moe_lm", "block.moe_layer.dims.ffn=7", "--cfg", "job", "-p", "block.moe_layer.dims"
    )
    _clean(done)
    shown = yaml.safe_load(done.stdout)
    assert shown["ffn"] == 7 and shown["experts"] == 4
    whole = yaml.safe_load(_cli("validate", "model=moe_lm", "--cfg", "job").stdout)
    assert set(whole["block"]) == {"moe_layer"} and whole["block"]["moe_layer"]["dims"]["ffn"] == 128


def test_completion_offers_no_block_group() -> None:
    """configs/block holds blocks a model's steps use; `block=` is no choice, so it is not offered."""
    line = "te-assembly validate "
    done = _cli("-sc", "query=bash", env={"COMP_LINE": line, "COMP_POINT": str(len(line))})
    _clean(done)
    words = done.stdout.split()
    assert "model=" in words and "recipe=" in words and not any(w.startswith("block=") for w in words)
