"""scripts/gpu_check.sh and prepare_gpu_bundle.sh on CPU: the dry run goes through every step up to the
first CUDA call (bundle checksums, tier collection, every verify and bench configuration composed and
checked against its recipe's shape rules), the time budget cuts steps instead of overrunning the
command, a damaged bundle stops at once, and a bundle over the carry limit is refused before upload.

The bundle here is a stand-in (files with the real names, checksummed) made for another Python, so the
install step is skipped; ``prepare_gpu_bundle.sh`` runs the same dry run on the real bundle with the GPU
image's Python and torch, where TE is installed from it and imported.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "scripts"))

from gpu_report import BENCH_GRID, VERIFY_GRID  # noqa: E402

pytestmark = pytest.mark.tools  # their own tier (pyproject.toml), run by CI after the multi-process one

FILES = (
    "te/transformer_engine-2.20.2-py3-none-any.whl",
    "te/transformer_engine_cu13-2.20.2-py3-none-manylinux_2_28_x86_64.whl",
    "te/transformer_engine_torch-2.20.2-cp00-cp00-linux_x86_64.whl",
    "te/transformer_engine_torch-2.20.2.tar.gz",
    "te/libtransformer_engine.sm90.so.xz",
    "te/cudnn_frontend_include.tar.xz",
    "deps/pydantic-2.14.4-py3-none-any.whl",
)


def _bundle(root: Path, size: int = 64) -> Path:
    bundle = root / "bundle"
    for name in FILES:
        path = bundle / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    manifest = "".join(f"{hashlib.sha256((bundle / n).read_bytes()).hexdigest()}  {n}\n" for n in FILES)
    (bundle / "MANIFEST.sha256").write_text(manifest)
    (bundle / "bundle.json").write_text(json.dumps({"python_tag": "cp00", "transformer_engine": "2.20.2"}))
    return bundle


def _run(script: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / script), *args],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def _check(bundle: Path, tmp: Path, *extra: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"OUT": str(tmp / "out"), "GPU_CHECK_STATE": str(tmp / "state")}
    return _run("gpu_check.sh", *extra, str(bundle), env={**base, **env})


def test_dry_run_goes_through_every_step(tmp_path: Path) -> None:
    result = _check(_bundle(tmp_path), tmp_path, "--dry-run")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "not installing, the bundle is for cp00" in result.stdout
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    steps = {s["step"]: s["status"] for s in summary["steps"]}
    assert steps == dict.fromkeys(("facts", "install", "sanity", "pytest", "verify", "bench"), "passed")
    # Every verify and bench configuration was composed and fits its recipe's shape rules.
    assert [c["label"] for c in summary["verify"]["cells"]] == [c.label for c in VERIFY_GRID]
    assert {c["status"] for c in summary["verify"]["cells"]} == {"dry-run"}
    assert {c["status"] for c in summary["bench"]["cells"]} == {"dry-run"}
    assert len(summary["bench"]["cells"]) == len(BENCH_GRID)
    # The gpu tier the device will run includes the CUDA-vs-CPU test and the recipe-active proofs.
    collected = summary["pytest"]["tests"]
    assert "tests/engines/test_model_api.py::test_cuda_matches_cpu" in collected
    assert any("test_recipe_is_active" in t for t in collected)
    assert any("test_float32_through_te_is_tf32" in t for t in collected)
    # What comes back fits the device tool: at most 8 files, no deeper than two folders.
    files = [p for p in out.rglob("*") if p.is_file()]
    assert 0 < len(files) <= 8 and all(len(p.relative_to(out).parts) <= 3 for p in files)


def test_budget_too_small_leaves_steps_for_a_rerun(tmp_path: Path) -> None:
    result = _check(_bundle(tmp_path), tmp_path, "--dry-run", GPU_CHECK_BUDGET_S="100")
    assert result.returncode == 75, result.stdout[-3000:]
    assert "run the same command again" in result.stdout
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    steps = {s["step"]: s["status"] for s in summary["steps"]}
    # Each step keeps the later steps' minimum time free: the early ones give way.
    assert steps["facts"] == steps["install"] == steps["sanity"] == "skipped", steps
    assert sum(s["seconds"] for s in summary["steps"]) <= 100


def test_damaged_bundle_stops_before_anything_runs(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    (bundle / FILES[4]).write_bytes(b"truncated")
    result = _check(bundle, tmp_path, "--dry-run")
    assert result.returncode == 1
    assert "do not match MANIFEST.sha256" in result.stdout
    assert "== facts" not in result.stdout


def test_bundle_over_the_carry_limit_is_refused(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path, size=600 * 1024)  # 7 files: about 4 MiB
    over = _run("prepare_gpu_bundle.sh", "--measure-only", str(bundle), env={"LIMIT_MIB": "2"})
    assert over.returncode == 1, over.stdout + over.stderr
    assert "over the 2 MiB the device tool carries" in over.stderr
    fits = _run("prepare_gpu_bundle.sh", "--measure-only", str(bundle), env={"LIMIT_MIB": "64"})
    assert fits.returncode == 0, fits.stdout + fits.stderr
    assert "limit 64 MiB per call" in fits.stdout and "libtransformer_engine.sm90.so.xz" in fits.stdout


@pytest.mark.parametrize("script", ["gpu_check.sh", "prepare_gpu_bundle.sh"])
def test_scripts_parse(script: str) -> None:
    assert subprocess.run(["bash", "-n", str(REPO_ROOT / "scripts" / script)], check=False).returncode == 0


def _stub_python(tmp: Path, fail_on: str = "") -> Path:
    """A stand-in interpreter for the GPU machine's python3: logs each call with its CUDA_MODULE_LOADING,
    succeeds (or fails for calls mentioning ``fail_on``), and runs the real summary step."""
    stub = tmp / "python3"
    calls = tmp / "calls.log"
    stub.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "${{CUDA_MODULE_LOADING:-lazy}} $*" >> {calls}\n'
        f'if [[ "$*" == *"gpu_report.py summary"* ]]; then exec {sys.executable} "$@"; fi\n'
        f'if [ -n "{fail_on}" ] && [[ "$*" == *"{fail_on}"* ]]; then echo "planted failure"; exit 1; fi\n'
        # Its Python tag, and the bundle's as read through it: both cp00, so the carried wheel fits.
        'if [[ "$*" == *version_info* ]] || [[ "$*" == *python_tag* ]]; then echo cp00; exit 0; fi\n'
        "cat > /dev/null 2>&1 <&0 || true\n"
        "exit 0\n"
    )
    stub.chmod(0o755)
    return stub


def test_a_failing_step_does_not_stop_the_bench_and_a_rerun_resumes(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    stub = _stub_python(tmp_path, fail_on="-m pytest")
    env = {"PYTHON": str(stub)}
    first = _check(bundle, tmp_path, **env)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    steps = {s["step"]: s["status"] for s in summary["steps"]}
    assert first.returncode == 1, first.stdout[-3000:]
    assert steps["pytest"] == "failed" and steps["verify"] == steps["bench"] == "passed", steps
    calls = (tmp_path / "calls.log").read_text().splitlines()
    eager = [c for c in calls if c.startswith("EAGER")]
    assert len(eager) == 1 and "gpu_sanity.py check" in eager[0]  # eager loading only for the sanity step
    pytest_call = next(c for c in calls if "-m pytest" in c)
    assert "-m gpu" in pytest_call and "tests" in pytest_call.split()
    # Same code, same bundle, warm machine: nothing runs again, the results are kept.
    (tmp_path / "calls.log").write_text("")
    second = _check(bundle, tmp_path, **env)
    assert second.returncode == 1 and second.stdout.count("done earlier with this code and bundle") == 6
    assert all("gpu_report.py summary" in c for c in (tmp_path / "calls.log").read_text().splitlines())
    # --force runs every step again.
    third = _check(bundle, tmp_path, "--force", **env)
    assert "done earlier" not in third.stdout and "== bench (limit" in third.stdout
