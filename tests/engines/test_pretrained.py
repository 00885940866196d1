"""``save_pretrained`` / ``from_pretrained`` / ``export``: weights with plain names and the resolved
config, loaded in either engine; a training checkpoint exported from the command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open

import te_assembly
from te_assembly.engines import build
from te_assembly.engines.reference.model import ReferenceModel
from te_assembly.engines.target import Target
from te_assembly.errors import OutputPathError
from te_assembly.files.directory import MANIFEST
from te_assembly.formats.checkpoint import CheckpointError, model_state
from te_assembly.formats.pretrained import CONFIG_FILE, WEIGHTS_FILE
from tests.conftest import REPO_ROOT
from tests.engines._helpers import build_yaml, plan_from_yaml, randomize

# Dotted step names (as blocks make them), a hidden channel, a public output and a bias-free linear.
NESTED = """
name: nested_names
in_features: 8
ops:
  - {name: keep, op: MakeExtraOutput, extra_outputs: {out: {channel: res, public: false}}}
  - {name: layers.0.fc, op: Linear, args: {in_features: 8, out_features: 12}}
  - {name: layers.0.act, op: GELU}
  - {name: layers.1.fc, op: Linear, args: {in_features: 12, out_features: 8, bias: false}}
  - {name: layers.1.norm, op: LayerNorm, args: {normalized_shape: 8}}
  - {name: back, op: AddExtraInput, extra_inputs: {addend: res}}
  - {name: tap, op: MakeExtraOutput, extra_outputs: {out: {channel: seen}}}
"""


def _inputs(seed: int = 3) -> torch.Tensor:
    return torch.randn(5, 8, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _keys(path: Path) -> set[str]:
    with safe_open(str(path), framework="pt") as f:
        return set(f.keys())


def test_round_trip_in_the_reference_engine(tmp_path: Path) -> None:
    model = build_yaml(NESTED)
    randomize(model)
    saved = te_assembly.save_pretrained(model, tmp_path / "pre")
    assert saved == tmp_path / "pre"
    # Plain parameter names, exactly the model's own (no "model/" prefix, no optimizer, no RNG).
    assert _keys(saved / WEIGHTS_FILE) == set(model.state_dict())
    assert any(k.startswith("steps.layers.0.fc.") for k in _keys(saved / WEIGHTS_FILE))
    config = yaml.safe_load((saved / CONFIG_FILE).read_text())
    assert config["model"]["name"] == "nested_names" and config["dtype"] == "float64"
    loaded = te_assembly.from_pretrained(saved, "reference")
    assert isinstance(loaded, ReferenceModel) and not loaded.training
    assert loaded.plan.name == model.plan.name
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
        assert loaded.state_dict()[name].dtype == torch.float64
    x = _inputs()
    model.eval()
    want, got = model(x), loaded(x)
    torch.testing.assert_close(got.y, want.y, rtol=0, atol=0)
    torch.testing.assert_close(got.extras["seen"], want.extras["seen"], rtol=0, atol=0)


def test_a_fresh_build_differs_so_the_round_trip_means_something() -> None:
    first, second = build_yaml(NESTED, seed=0), build_yaml(NESTED, seed=0)
    randomize(first)
    assert not torch.equal(first(_inputs()).y, second(_inputs()).y)


def test_save_refuses_a_directory_in_use_and_overwrites_only_its_own(tmp_path: Path) -> None:
    model = build_yaml(NESTED)
    target = tmp_path / "pre"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    with pytest.raises(OutputPathError, match="not empty"):
        te_assembly.save_pretrained(model, target)
    # overwrite replaces only what te_assembly wrote: the user's notes are never deleted
    with pytest.raises(OutputPathError, match=r"did not write \(notes\.txt\)"):
        te_assembly.save_pretrained(model, target, overwrite=True)
    assert (target / "notes.txt").read_text() == "mine" and not (target / WEIGHTS_FILE).exists()
    (target / "notes.txt").unlink()
    te_assembly.save_pretrained(model, target)
    first = (target / WEIGHTS_FILE).read_bytes()
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    te_assembly.save_pretrained(model, target, overwrite=True)
    assert (target / WEIGHTS_FILE).read_bytes() != first


def test_load_refuses_weights_of_another_model(tmp_path: Path) -> None:
    model = build_yaml(NESTED)
    saved = te_assembly.save_pretrained(model, tmp_path / "pre")
    config = yaml.safe_load((saved / CONFIG_FILE).read_text())
    config["model"]["ops"][1]["args"]["out_features"] = 16  # layers.0.fc now 8 -> 16
    config["model"]["ops"][3]["args"]["in_features"] = 16
    (saved / CONFIG_FILE).write_text(yaml.safe_dump(config))
    with pytest.raises(CheckpointError, match=r"layers\.0\.fc"):
        te_assembly.from_pretrained(saved, "reference")


def test_load_refuses_a_corrupt_or_missing_weights_file(tmp_path: Path) -> None:
    saved = te_assembly.save_pretrained(build_yaml(NESTED), tmp_path / "pre")
    data = bytearray((saved / WEIGHTS_FILE).read_bytes())
    data[-3] ^= 0xFF  # a flipped byte inside the last tensor
    (saved / WEIGHTS_FILE).write_bytes(bytes(data))
    with pytest.raises(CheckpointError):
        te_assembly.from_pretrained(saved, "reference")
    (saved / WEIGHTS_FILE).unlink()
    with pytest.raises(CheckpointError, match=WEIGHTS_FILE):
        te_assembly.from_pretrained(saved, "reference")
    with pytest.raises(CheckpointError, match="no such directory"):
        te_assembly.from_pretrained(tmp_path / "nowhere")


@pytest.mark.te
@pytest.mark.parametrize("model_name", ["residual_mlp", "moe_block"])
def test_weights_load_across_engines(tmp_path: Path, model_name: str) -> None:
    """Reference -> TE and TE -> reference (TE's fuser on CPU with kernels=reference)."""
    torch.manual_seed(0)
    ref = build(model_name, "reference")
    randomize(ref, scale=0.2)
    te_assembly.save_pretrained(ref, tmp_path / "from_ref")
    te_model = te_assembly.from_pretrained(
        tmp_path / "from_ref", Target.of("te", device="cpu", kernels="reference")
    )
    assert type(te_model).__name__ == "TEModel"
    x = torch.randn(32, ref.plan.in_features, generator=torch.Generator().manual_seed(1))
    ref.eval()
    torch.testing.assert_close(te_model(x).y, ref(x).y, rtol=1e-5, atol=1e-5)
    # And back: a TE model's save loads into the reference engine with the same tensors.
    te_assembly.save_pretrained(te_model, tmp_path / "from_te")
    back = te_assembly.from_pretrained(tmp_path / "from_te", "reference")
    for name, tensor in ref.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name


def test_export_a_training_run_from_the_command_line(tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb", "PYTHONPATH": str(REPO_ROOT)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "te_assembly", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    done = cli("train", "model=residual_mlp", "train.steps=2", "train.batch_tokens=32")
    assert done.returncode == 0, done.stderr
    (run,) = (tmp_path / "outputs" / "residual_mlp").iterdir()
    done = cli("export", str(run.relative_to(tmp_path)), "shared_model")
    assert done.returncode == 0, done.stderr
    out = tmp_path / "shared_model"
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, CONFIG_FILE, WEIGHTS_FILE]
    _, trained = model_state(run / "ckpt-0000002.safetensors")
    loaded = te_assembly.from_pretrained(out, "reference")
    assert set(loaded.state_dict()) == set(trained)
    for name, tensor in trained.items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    # The default destination is pretrained/ in the run; a second export into it is refused.
    assert cli("export", f"export.checkpoint={run}").returncode == 0
    assert (run / "pretrained" / WEIGHTS_FILE).exists()
    again = cli("export", str(run))
    assert again.returncode == 1 and "overwrite" in again.stderr
    missing = cli("export")
    assert missing.returncode == 2 and "export.checkpoint" in missing.stderr


def test_from_pretrained_builds_a_plan_equal_to_the_saved_models(tmp_path: Path) -> None:
    plan = plan_from_yaml(NESTED)
    saved = te_assembly.save_pretrained(build_yaml(NESTED), tmp_path / "pre")
    loaded = te_assembly.from_pretrained(saved, "reference")
    assert [(s.name, s.type, s.fuser) for s in loaded.plan.steps] == [
        (s.name, s.type, s.fuser) for s in plan.steps
    ]
    assert list(loaded.plan.channels) == list(plan.channels)


def test_a_changed_config_is_refused_by_its_checksum(tmp_path: Path) -> None:
    """One flipped character of config.yaml (an eps, a scale) would load a different model silently."""
    saved = te_assembly.save_pretrained(build_yaml(NESTED), tmp_path / "pre")
    text = (saved / CONFIG_FILE).read_text()
    assert "eps: 1.0e-05" in text or "eps:" in text
    changed = text.replace("eps: 1.0e-05", "eps: 1.0e-04", 1) if "eps: 1.0e-05" in text else text + "\n#"
    (saved / CONFIG_FILE).write_text(changed)
    with pytest.raises(CheckpointError, match=r"does not match the checksum recorded in model\.safetensors"):
        te_assembly.from_pretrained(saved, "reference")
    (saved / CONFIG_FILE).write_text(text)
    assert te_assembly.from_pretrained(saved, "reference").plan.name


def test_non_finite_weights_are_never_saved_or_loaded(tmp_path: Path) -> None:
    import torch

    from te_assembly.errors import NonFiniteError

    model = build_yaml(NESTED)
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] = float("nan")
    with pytest.raises(NonFiniteError, match="non-finite value in steps"):
        te_assembly.save_pretrained(model, tmp_path / "nan")
    assert not (tmp_path / "nan" / WEIGHTS_FILE).exists()


def test_a_run_directory_is_pointed_to_export(tmp_path: Path) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parents[1] / "configs" / "saved" / "run_v0", run)
    with pytest.raises(CheckpointError, match=r"is a training run, not a pretrained model directory: export"):
        te_assembly.from_pretrained(run, "reference")
    assert te_assembly.from_pretrained(te_assembly.export_checkpoint(run), "reference").plan.name


def test_overwrite_is_atomic_as_a_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A save that dies between the weights and the config leaves the old directory loadable, and no
    staging directory behind."""
    import torch

    import te_assembly.formats.pretrained as pretrained

    first = build_yaml(NESTED)
    target = te_assembly.save_pretrained(first, tmp_path / "pre")
    old = {k: v.clone() for k, v in te_assembly.from_pretrained(target, "reference").state_dict().items()}
    second = build_yaml(NESTED)
    with torch.no_grad():
        for p in second.parameters():
            p.add_(1.0)

    def dies(path: Path, text: str) -> Path:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pretrained, "write_text_atomic", dies)
    with pytest.raises(OSError):
        te_assembly.save_pretrained(second, target, overwrite=True)
    monkeypatch.undo()
    again = te_assembly.from_pretrained(target, "reference").state_dict()
    assert all(torch.equal(again[k], v) for k, v in old.items())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pre"]  # nothing left beside it
    te_assembly.save_pretrained(second, target, overwrite=True)
    new = te_assembly.from_pretrained(target, "reference").state_dict()
    assert not all(torch.equal(new[k], v) for k, v in old.items() if v.is_floating_point())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pre"]


def test_a_save_killed_mid_write_leaves_the_old_directory(tmp_path: Path) -> None:
    """SIGKILL between writing the weights and the config: the old directory still loads, and the next
    save clears what the killed one left."""
    import signal
    import subprocess
    import sys
    import textwrap

    target = te_assembly.save_pretrained(build_yaml(NESTED), tmp_path / "pre")
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        import te_assembly, te_assembly.formats.pretrained as pretrained
        from tests.engines.test_pretrained import NESTED, build_yaml
        real = pretrained.write_text_atomic
        def killed(path, text):
            os.kill(os.getpid(), signal.SIGKILL)
        pretrained.write_text_atomic = killed
        te_assembly.save_pretrained(build_yaml(NESTED), {str(target)!r}, overwrite=True)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert te_assembly.from_pretrained(target, "reference").plan.name
    assert any(p.name.endswith(".saving") for p in tmp_path.iterdir())  # what the killed save left
    te_assembly.save_pretrained(build_yaml(NESTED), target, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pre"]


def test_exporting_a_run_with_a_corrupt_newest_checkpoint_names_the_good_one(tmp_path: Path) -> None:
    from te_assembly.jobs.train.job import train
    from te_assembly.jobs.train.settings import TrainSettings

    plan = te_assembly.load("residual_mlp", ["model.dims.hidden=8", "model.dims.ffn=8"]).checked_plan()
    out = tmp_path / "run"
    settings = TrainSettings(steps=4, batch_tokens=8, checkpoint_every=2, plot=False, out_dir=str(out))
    train(plan, "reference", settings)
    newest = out / "ckpt-0000004.safetensors"
    data = bytearray(newest.read_bytes())
    data[-3] ^= 0xFF
    newest.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as info:
        te_assembly.export_checkpoint(out, tmp_path / "pre")
    good = out / "ckpt-0000002.safetensors"
    assert f"export it with python -m te_assembly export {good}" in str(info.value)
    assert "train.resume" not in str(info.value)
    assert te_assembly.from_pretrained(te_assembly.export_checkpoint(good, tmp_path / "pre")).plan.name
