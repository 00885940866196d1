"""Configs never run code and never leak the environment: a user's primary config cannot make Hydra
build callbacks, logging handlers or any ``_target_``; model, block and recipe files cannot read the
environment. Each is refused with its key path (exit 2) before anything happens."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from te_assembly.config.no_code import code_in_config

REPO_ROOT = Path(__file__).resolve().parents[2]


def _cli(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb", "TE_ASSEMBLY_SECRET": "s3cr3t"}
    return subprocess.run(
        [sys.executable, "-m", "te_assembly", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _primary(folder: Path, name: str, body: str) -> None:
    (folder / f"{name}.yaml").write_text("defaults: [config, _self_]\n" + body)


def test_hydra_callbacks_are_refused_and_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    body = f"hydra:\n  callbacks:\n    touch:\n      _target_: pathlib.Path.touch\n      self: {marker}\n"
    _primary(tmp_path, "cb", body)
    done = _cli(tmp_path, "validate", "-cd", str(tmp_path), "-cn", "cb")
    assert done.returncode == 2, done.stderr
    assert "hydra.callbacks.touch._target_: _target_ 'pathlib.Path.touch' would build a Python object" in (
        done.stdout + done.stderr
    )
    assert not marker.exists() and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("handler", "key"),
    [
        ("class: logging.FileHandler\n        filename: {victim}\n        mode: w", "evil.class"),
        ("class: logging.StreamHandler\n        stream: ext://builtins.open", "evil.stream"),
        ("'()': logging.FileHandler\n        filename: {victim}\n        mode: w", "evil.()"),
    ],
)
def test_logging_handlers_that_write_files_are_refused(tmp_path: Path, handler: str, key: str) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    text = handler.format(victim=victim)
    handlers = f"    handlers:\n      evil:\n        {text}\n"
    body = f"hydra:\n  job_logging:\n{handlers}    root:\n      handlers: [evil]\n"
    _primary(tmp_path, "lg", body)
    done = _cli(tmp_path, "run", "-cd", str(tmp_path), "-cn", "lg", "run.steps=1", "run.tokens=8")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"hydra.job_logging.handlers.{key}" in done.stdout + done.stderr
    assert victim.read_text() == "precious"


def test_a_target_in_a_settings_section_is_refused(tmp_path: Path) -> None:
    done = _cli(tmp_path, "validate", "+run._target_=os.getcwd")
    assert done.returncode == 2
    assert "run._target_: _target_ 'os.getcwd' would build a Python object" in done.stdout + done.stderr


def test_hydra_defaults_and_the_shipped_logging_pass() -> None:
    from omegaconf import OmegaConf

    from te_assembly.config.composition import compose

    cfg = OmegaConf.to_container(compose([]), resolve=False)
    assert isinstance(cfg, dict) and code_in_config(cfg) == []  # launcher, sweeper, stderr logging


@pytest.mark.parametrize("where", ["model", "recipe", "block"])
def test_the_environment_is_never_read_into_a_config_file(tmp_path: Path, where: str) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "recipe").mkdir()
    (tmp_path / "block").mkdir()
    secret = "${oc.env:TE_ASSEMBLY_SECRET}"
    channel = f"tok_{secret}" if where == "model" else "residual"
    (tmp_path / "model" / "leaky.yaml").write_text(
        "name: leaky\nin_features: 8\nops:\n"
        "  - name: tap\n    op: MakeExtraOutput\n"
        f"    extra_outputs:\n      out: {{channel: '{channel}', public: true}}\n"
        + ("  - name: inner\n    block: leaky_block\n" if where == "block" else "")
    )
    (tmp_path / "recipe" / "leaky_recipe.yaml").write_text(
        f"kind: DelayedScaling\nname: '{secret if where == 'recipe' else 'leaky_recipe'}'\n"
    )
    scale = f"${{oc.decode:{secret}}}" if where == "block" else "2.0"
    (tmp_path / "block" / "leaky_block.yaml").write_text(
        f"name: leaky_block\nops:\n  - name: s\n    op: ConstantScale\n    args: {{scale: '{scale}'}}\n"
    )
    done = _cli(tmp_path, "validate", "-cd", str(tmp_path), "model=leaky", "recipe=leaky_recipe")
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert f"is not allowed in a {where} file" in out
    assert "s3cr3t" not in out


def test_settings_may_still_read_the_environment(tmp_path: Path) -> None:
    done = _cli(tmp_path, "validate", "model=residual_mlp", "seed=${oc.decode:${oc.env:TE_ASSEMBLY_SEED}}")
    assert done.returncode == 2 and "TE_ASSEMBLY_SEED" in done.stdout + done.stderr  # unset: refused by value


@pytest.mark.parametrize(
    ("filename", "allowed"),
    [
        ("${hydra.runtime.output_dir}/${hydra.job.name}.log", True),
        ("${hydra.runtime.output_dir}/../outside.log", False),
        ("${hydra.runtime.output_dir}/sub/dir.log", False),
        ("/etc/passwd", False),
    ],
)
def test_only_hydras_own_log_file_may_be_written(filename: str, allowed: bool) -> None:
    handler = {"class": "logging.FileHandler", "formatter": "simple", "filename": filename}
    found = code_in_config({"hydra": {"job_logging": {"handlers": {"file": handler}}}})
    assert (found == []) is allowed
    mode_w = code_in_config({"hydra": {"job_logging": {"handlers": {"file": {**handler, "mode": "w"}}}}})
    assert mode_w and mode_w[0].path == "hydra.job_logging.handlers.file.class"
