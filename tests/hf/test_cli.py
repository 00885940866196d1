"""The commands as a new user runs them, from a folder outside the repository: import-hf, validate and
train the imported YAML, verify hf=, export format=hf."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.hf.tiny import make

pytestmark = pytest.mark.slow


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "te_assembly", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        check=False,
    )


def test_import_validate_verify_train_export(tmp_path: Path) -> None:
    make("qwen3_moe", tmp_path / "tiny", changes={"vocab_size": 272})
    done = _cli("import-hf", "tiny", "mine", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "imported Qwen3MoeForCausalLM" in done.stdout and "validate -cd mine model=mine" in done.stdout
    assert _cli("validate", "-cd", "mine", "model=mine", cwd=tmp_path).returncode == 0
    explain = _cli("explain", "-cd", "mine", "model=mine", cwd=tmp_path)
    assert explain.returncode == 0 and "qk_norm" in explain.stdout, explain.stdout + explain.stderr

    verify = _cli("verify", "hf=tiny", "dtype=float64", "hydra.run.dir=v", cwd=tmp_path)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    report = json.loads((tmp_path / "v" / "verify.json").read_text())
    assert report["passed"] and report["architecture"] == "Qwen3MoeForCausalLM"
    assert max(report["differences"].values()) <= 1e-10
    assert sum(k.startswith("grad ") for k in report["differences"]) > 20

    train = _cli(
        "train",
        "-cd",
        "mine",
        "model=mine",
        "train.init_from=mine",
        "train.steps=2",
        "train.eval_every=2",
        "train.batch_tokens=256",
        "train.seq_len=32",
        "hydra.run.dir=run",
        cwd=tmp_path,
    )
    assert train.returncode == 0, train.stdout + train.stderr
    assert "started from the weights of mine" in train.stdout + train.stderr
    export = _cli("export", "run", "hf-out", "export.format=hf", cwd=tmp_path)
    assert export.returncode == 0, export.stderr
    config = json.loads((tmp_path / "hf-out" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"] and config["num_experts"] == 4
    # an existing directory is never overwritten without asking
    again = _cli("export", "run", "hf-out", "export.format=hf", cwd=tmp_path)
    assert again.returncode != 0 and "hf-out" in again.stdout + again.stderr


def test_verify_hf_exits_1_naming_the_worst_tensor(
    hf_dir: Callable[[str], Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A planted difference: te_assembly's import of the checkpoint gets one expert weight nudged by
    1e-6 (the norm scales and biases of the tiny checkpoints already start away from 1 and 0)."""
    import torch

    from te_assembly.cli.main import main
    from te_assembly.formats.hf import convert

    real = convert.from_hf

    def nudged(*args: object, **kwargs: object) -> object:
        model = real(*args, **kwargs)  # type: ignore[arg-type]
        with torch.no_grad():
            model.state_dict()["steps.layers.0.fc1.weight2"][1, 1] += 1e-6
        return model

    monkeypatch.setattr(convert, "from_hf", nudged)
    monkeypatch.chdir(tmp_path)
    code = main(["verify", f"hf={hf_dir('mixtral')}", "dtype=float64", "hydra.run.dir=v"])
    out = capsys.readouterr().out
    assert code == 1
    assert "verify FAILED" in out and "grad steps.layers.0." in out.split("verify FAILED")[1]
    assert not json.loads((tmp_path / "v" / "verify.json").read_text())["passed"]
