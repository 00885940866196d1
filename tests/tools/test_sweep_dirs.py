"""Two ``-m`` sweeps that would share a sweep directory (same second, or a fixed ``hydra.sweep.dir``
in a user's primary config) each get their own, with their own ``multirun.yaml``: nothing recorded by
one is overwritten by the other."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from te_assembly.cli.job_dir import claim_sweep


def _sweep(folder: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "COLUMNS": "300", "NO_COLOR": "1"}
    command = [sys.executable, "-m", "te_assembly", "validate", "-m", "-cd", "cfgs", "-cn", "fixed", *args]
    return subprocess.Popen(
        command, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_concurrent_sweeps_keep_their_own_records(tmp_path: Path) -> None:
    (tmp_path / "cfgs").mkdir()
    (tmp_path / "cfgs" / "fixed.yaml").write_text(
        "defaults: [config, _self_]\nhydra:\n  sweep:\n    dir: sweeps/same\n"
    )
    first = _sweep(tmp_path, "model=residual_mlp,two_stage")
    second = _sweep(tmp_path, "model=moe_block,fanout_mlp")
    for proc in (first, second):
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    records = sorted((tmp_path / "sweeps").glob("same*/multirun.yaml"))
    assert [p.parent.name for p in records] == ["same", "same_1"]
    swept = sorted(
        yaml.safe_load(p.read_text())["hydra"]["overrides"]["task"][0] for p in records
    )  # each holds its own sweep's models
    assert swept == ["model=moe_block,fanout_mlp", "model=residual_mlp,two_stage"]


def test_claim_sweep_takes_the_first_free_name(tmp_path: Path) -> None:
    wanted = tmp_path / "multirun" / "2026-12-01" / "10-00-00"
    assert claim_sweep(wanted) == wanted
    assert claim_sweep(wanted) == wanted.with_name("10-00-00_1")
    assert claim_sweep(wanted) == wanted.with_name("10-00-00_2")
    assert (wanted / "multirun.yaml").is_file()
