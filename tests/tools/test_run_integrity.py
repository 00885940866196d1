"""Training runs are never spliced, overwritten or silently corrupted.

Two real processes contend for one run directory; checkpoints are corrupted byte by byte (tensor
data, metadata, header, truncation), renamed, replaced by a directory or a FIFO, and crafted with valid
checksums but bad fields; the disk fills up mid-write; a resume changes the model or the recipe.
Every case must end in a one-line refusal (exit 1, or 2 for config) with nothing lost.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from te_assembly.analysis.pipeline import load
from te_assembly.analysis.plan import Plan
from te_assembly.engines import build
from te_assembly.engines.target import Target
from te_assembly.errors import ConfigError, NonFiniteError, RunDirectoryInUseError
from te_assembly.formats.checkpoint import (
    CheckpointError,
    checkpoint_path,
    list_checkpoints,
    load_checkpoint,
    prune,
    read_header,
    save_checkpoint,
    verify,
)
from te_assembly.formats.checkpoint import file as ckpt_module
from te_assembly.jobs.train import job as loop_module
from te_assembly.jobs.train.job import train
from te_assembly.jobs.train.lock import LOCK_NAME, RunLock
from te_assembly.jobs.train.run_dir import resume_point
from te_assembly.jobs.train.run_record import ExistingRunError, record_sha256
from te_assembly.jobs.train.schedule import make_optimizer
from te_assembly.jobs.train.settings import TrainSettings
from tests.conftest import REPO_ROOT

SMALL = ["model=residual_mlp", "model.dims.hidden=16", "model.dims.ffn=32"]
MOE = ["model=moe_block", "model.dims.hidden=16", "model.dims.ffn=8"]


def _plan(overrides: list[str]) -> Plan:
    analysis = load(None, overrides)
    assert analysis.plan is not None, [d.format() for d in analysis.diagnostics]
    return analysis.plan


@pytest.fixture(scope="module")
def small_plan() -> Plan:
    return _plan(SMALL)


def _settings(out: Path, **kw: Any) -> TrainSettings:
    base: dict[str, Any] = {
        "steps": 12,
        "batch_tokens": 16,
        "warmup_steps": 2,
        "checkpoint_every": 4,
        "keep_checkpoints": 10,
        "plot": False,
        "out_dir": str(out),
    }
    base.update(kw)
    return TrainSettings(**base)


def _bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file() and p.name != LOCK_NAME}


def _unchanged_but_metrics(before: dict[str, bytes], after: dict[str, bytes], steps: int) -> None:
    """Every file as it was, except the run files written as a run goes: ``metrics.jsonl`` now holds the
    earlier records and those of the steps that ran (a crash keeps them), ``config.yaml`` the
    invocation's config (a resume's ``train.resume: true``)."""
    growing = ("metrics.jsonl", "config.yaml")
    assert {k: v for k, v in after.items() if k not in growing} == {
        k: v for k, v in before.items() if k not in growing
    }
    metrics = after["metrics.jsonl"]
    assert metrics.startswith(before["metrics.jsonl"])
    assert [json.loads(line)["step"] for line in metrics.splitlines()] == list(range(1, steps + 1))


def _flip(path: Path, offset: int, mask: int = 0x10) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def _tensor_offset(path: Path, name: str = "model/steps.fc1.basic_ops.0.weight") -> int:
    """A byte inside tensor ``name``'s data, read from the safetensors layout (an 8-byte header length,
    the JSON header, then the data)."""
    raw = path.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    entries = json.loads(raw[8 : 8 + length])
    return 8 + length + entries[name]["data_offsets"][0] + 3


def _craft(
    path: Path,
    meta: Callable[[dict[str, Any]], None] = lambda m: None,
    tensors: Callable[[dict[str, torch.Tensor]], None] = lambda t: None,
    raw_step: str | None = None,
) -> None:
    """Rewrite ``path`` with changed metadata or tensors and VALID checksums: what only a bug or a
    malicious file could hold. The checks behind the checksums must still catch it."""
    values = load_file(str(path))
    with safe_open(str(path), framework="pt") as f:
        metadata = dict(f.metadata())
    record = json.loads(metadata["te_assembly"])
    tensors(values)
    meta(record)
    record["tensors"] = {
        name: {
            "dtype": ckpt_module._dtype_name(t.dtype),
            "shape": list(t.shape),
            "sha256": ckpt_module._digest(t.contiguous()),
        }
        for name, t in values.items()
    }
    raw = json.dumps(record)
    metadata = {
        "te_assembly": raw,
        "te_assembly_sha256": hashlib.sha256(raw.encode()).hexdigest(),
        "step": raw_step if raw_step is not None else str(record["step"]),
    }
    save_file({k: v.contiguous() for k, v in values.items()}, str(path), metadata=metadata)


# --- the lock: two real processes ---------------------------------------------------------------

_HOLD = """
import sys
from pathlib import Path
from te_assembly.jobs.train.lock import RunLock
lock = RunLock(Path(sys.argv[1])).acquire()
print("locked", flush=True)
sys.stdin.read()
"""


def _holder(out: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(out)],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_run_on_a_held_directory_is_refused_and_touches_nothing(
    small_plan: Plan, tmp_path: Path
) -> None:
    train(small_plan, Target.of("reference", seed=0), _settings(tmp_path, steps=4))
    live_temp = tmp_path / ".ckpt-0000008.safetensors.live.tmp"  # the other run's write in progress
    live_temp.write_bytes(b"half a checkpoint")
    before = _bytes(tmp_path)
    proc = _holder(tmp_path)
    try:
        for settings in (
            _settings(tmp_path, steps=8, resume=True),
            _settings(tmp_path, steps=4, overwrite=True),
            _settings(tmp_path, steps=4),
        ):
            with pytest.raises(RunDirectoryInUseError) as info:
                train(small_plan, Target.of("reference", seed=0), settings)
            message = str(info.value)
            assert f"in use by another training run: pid {proc.pid} on host" in message
            assert "use another train.out_dir" in message
            assert _bytes(tmp_path) == before  # the live run's temp file and checkpoints untouched
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=60)
    # The holder is gone (its flock went with it): the directory is free, and the stale temp file is
    # removed by the run that now holds the lock.
    result = train(small_plan, Target.of("reference", seed=0), _settings(tmp_path, steps=8, resume=True))
    assert result.start_step == 4 and not live_temp.exists()
    assert f"removed stale temp file {live_temp}" in result.notes


def _cli(args: list[str], **kw: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.Popen(
        [sys.executable, "-m", "te_assembly", *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


TRAIN_ARGS = [
    "train",
    *SMALL,
    "engine=reference",
    "train.batch_tokens=8",
    "train.plot=false",
    "train.schedule=constant",
    "train.warmup_steps=0",
    "train.checkpoint_every=2",
]


def test_two_train_processes_on_one_directory(tmp_path: Path) -> None:
    """A live run is never disturbed by a second train, fresh or resume; once it dies (kill -9) its
    lock is gone with it and a resume continues from its last checkpoint."""
    first = _cli([*TRAIN_ARGS, "train.steps=1000000", f"train.out_dir={tmp_path}"])
    try:
        deadline = time.monotonic() + 120
        while not list_checkpoints(tmp_path):
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the first run wrote no checkpoint in 120 s"
            time.sleep(0.2)
        for extra in (["train.resume=true"], [], ["train.overwrite=true"]):
            second = _cli([*TRAIN_ARGS, "train.steps=1000000", f"train.out_dir={tmp_path}", *extra])
            out, err = second.communicate(timeout=120)
            assert second.returncode == 1, (out, err)
            err = _one_line(err)
            assert f"is in use by another training run: pid {first.pid} on host" in err
            assert "Traceback" not in err + out
            assert "regress a teacher" not in out  # refused before the run header
            assert first.poll() is None  # the live run carries on
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=60)
    last = list_checkpoints(tmp_path)[-1][0]
    resumed = _cli(
        [
            *TRAIN_ARGS,
            "train.steps=1000000",
            f"train.stop_after={last + 2}",
            "train.resume=true",
            f"train.out_dir={tmp_path}",
        ]
    )
    out, err = resumed.communicate(timeout=180)
    assert resumed.returncode == 0, (out, err)
    out = _one_line(out)
    assert f"resumed from {checkpoint_path(tmp_path, last)} (step {last})" in out
    assert list_checkpoints(tmp_path)[-1][0] == last + 2
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_the_lock_records_its_holder(tmp_path: Path) -> None:
    with RunLock(tmp_path):
        info = json.loads((tmp_path / LOCK_NAME).read_text())
        assert info["pid"] == os.getpid() and info["host"] and info["started"]
        with pytest.raises(RunDirectoryInUseError, match=rf"pid {os.getpid()}"):
            RunLock(tmp_path).acquire()  # another open file description: refused even in-process
    assert not (tmp_path / LOCK_NAME).exists()  # a finished holder leaves no lock file
    RunLock(tmp_path).acquire().release()  # released on exit
    # Probes share: two at once do not refuse each other, but refuse an exclusive lock meanwhile, and an
    # exclusive holder refuses them; a probe of a directory without a lock file creates none.
    RunLock(tmp_path, shared=True).acquire().release()
    assert not (tmp_path / LOCK_NAME).exists()
    (tmp_path / LOCK_NAME).touch()
    with RunLock(tmp_path, shared=True), RunLock(tmp_path, shared=True):
        with pytest.raises(RunDirectoryInUseError):
            RunLock(tmp_path).acquire()
    with RunLock(tmp_path):
        with pytest.raises(RunDirectoryInUseError):
            RunLock(tmp_path, shared=True).acquire()


_CONTENDER = """
import sys, time
from pathlib import Path
from te_assembly.errors import RunDirectoryInUseError
from te_assembly.jobs.train.lock import RunLock

out, rounds = Path(sys.argv[1]), int(sys.argv[2])
done = 0
while done < rounds:
    try:
        lock = RunLock(out).acquire()
    except RunDirectoryInUseError:
        time.sleep(0.001)
        continue
    try:
        counter = out / "counter"
        value = int(counter.read_text()) if counter.exists() else 0
        time.sleep(0.0005)  # widen the window a second holder would need
        counter.write_text(str(value + 1))
    finally:
        lock.release()
    done += 1
"""


def test_the_lock_excludes_while_holders_remove_it(tmp_path: Path) -> None:
    """Four processes take the lock 25 times each, read-modify-write a counter under it, and remove the
    lock file at every release: no update is lost, so no two ever held it at once."""
    script = tmp_path / "contend.py"
    script.write_text(_CONTENDER)
    out = tmp_path / "run"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    procs = [subprocess.Popen([sys.executable, str(script), str(out), "25"], env=env) for _ in range(4)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0, 0]
    assert (out / "counter").read_text() == "100"
    assert not (out / LOCK_NAME).exists()


# --- corruption ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def _run_to_12_template(
    small_plan: Plan, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[float]]:
    root = tmp_path_factory.mktemp("run12")
    full = train(small_plan, Target.of("reference", seed=7), _settings(root / "full", steps=16)).losses
    out = root / "run"
    train(small_plan, Target.of("reference", seed=7), _settings(out, steps=16, stop_after=12))
    assert [s for s, _ in list_checkpoints(out)] == [4, 8, 12]
    return out, full


@pytest.fixture
def run_to_12(_run_to_12_template: tuple[Path, list[float]], tmp_path: Path) -> tuple[Path, list[float]]:
    """A run stopped at step 12 (checkpoints 4, 8, 12; a fresh copy per test) and the losses of the same
    run done in one go to step 16."""
    template, full = _run_to_12_template
    out = tmp_path / "run"
    shutil.copytree(template, out)
    return out, full


CORRUPTIONS: dict[str, tuple[Callable[[Path], None], str]] = {
    "tensor byte": (lambda p: _flip(p, _tensor_offset(p)), "does not match its checksum"),
    "rng byte": (lambda p: _flip(p, _tensor_offset(p, "rng/torch_cpu")), "'rng/torch_cpu' does not match"),
    "metadata byte": (
        # Inside the run record's hash; bit 0 keeps a hex digit a hex-ish letter (0x10 could make '2' a
        # quote, which breaks the header's JSON instead of its checksum).
        lambda p: _flip(p, p.read_bytes().index(b"run_sha256") + 20, 0x01),
        "metadata does not match the checksum",
    ),
    "header length": (lambda p: _flip(p, 5), "the header claims"),
    "header shape": (
        lambda p: p.write_bytes(p.read_bytes().replace(b'"shape":[16]', b'"shape":[61]', 1)),
        "shape, dtype or data offsets are inconsistent",
    ),
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:-100]), "truncated"),
    "empty": (lambda p: p.write_bytes(b""), "too short"),
    "not safetensors": (
        lambda p: p.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00[1,2]"),
        "not a JSON object",
    ),
    "directory": (lambda p: (p.unlink(), p.mkdir()), "is a directory"),
    "fifo": (lambda p: (p.unlink(), os.mkfifo(p)), "is a FIFO"),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_a_corrupt_newest_checkpoint_is_refused_naming_the_good_one(
    small_plan: Plan, run_to_12: tuple[Path, list[float]], case: str
) -> None:
    out, full = run_to_12
    newest = checkpoint_path(out, 12)
    corrupt, problem = CORRUPTIONS[case]
    corrupt(newest)
    before = _bytes(out)
    good = checkpoint_path(out, 8)
    with pytest.raises(CheckpointError) as info:
        train(small_plan, Target.of("reference", seed=7), _settings(out, steps=16, resume=True))
    message = str(info.value)
    assert problem in message and str(newest) in message
    assert f"the newest good checkpoint is {good} (step 8" in message
    assert f"train.resume=true train.resume_from={good}" in message
    assert _bytes(out) == before  # reported, not touched

    # The command it gives works: the run continues from step 8, exactly as if never interrupted, and
    # the corrupt file is kept aside, never read again.
    resumed = train(
        small_plan,
        Target.of("reference", seed=7),
        _settings(out, steps=16, resume=True, resume_from=str(good)),
    )
    assert resumed.start_step == 8 and resumed.losses == full
    assert any(f"set aside {newest}" in note for note in resumed.notes)
    assert (out / f"{newest.name}.corrupt").exists()
    assert [s for s, _ in list_checkpoints(out)] == [4, 8, 12, 16]
    verify(checkpoint_path(out, 12))  # rewritten, good


def test_cli_corrupt_checkpoint_is_one_line_exit_1_and_fifo_never_hangs(
    run_to_12: tuple[Path, list[float]],
) -> None:
    out, _ = run_to_12
    newest = checkpoint_path(out, 12)
    newest.unlink()
    os.mkfifo(newest)
    args = [
        *SMALL,
        "engine=reference",
        "train.steps=16",
        "train.batch_tokens=16",
        "train.plot=false",
        f"train.out_dir={out}",
        "train.checkpoint_every=4",
        "train.warmup_steps=2",
    ]
    for extra, code, text in (
        (["train.resume=true"], 1, "is a FIFO (named pipe), not a checkpoint file"),
        ([], 1, "already holds checkpoints up to step 8 and 1 file(s) that cannot be read"),
    ):
        proc = _cli(["train", *args, *extra])
        out_text, err = proc.communicate(timeout=120)  # a FIFO opened for reading would block forever
        assert proc.returncode == code, (out_text, err)
        assert text in _one_line(err) and "Traceback" not in err


def test_all_checkpoints_corrupt_is_refused_with_the_way_out(
    small_plan: Plan, run_to_12: tuple[Path, list[float]]
) -> None:
    out, _ = run_to_12
    for step in (4, 8, 12):
        path = checkpoint_path(out, step)
        _flip(path, _tensor_offset(path))
    with pytest.raises(CheckpointError, match=r"holds no good checkpoint:(\n  .*checksum){3}\nstart over"):
        train(small_plan, Target.of("reference", seed=7), _settings(out, steps=16, resume=True))


def test_an_old_unreadable_file_does_not_block_a_newer_good_one(
    small_plan: Plan, run_to_12: tuple[Path, list[float]]
) -> None:
    out, full = run_to_12
    old = checkpoint_path(out, 4)
    old.write_bytes(b"junk")
    resumed = train(small_plan, Target.of("reference", seed=7), _settings(out, steps=16, resume=True))
    assert resumed.start_step == 12 and resumed.losses == full
    assert any(note.startswith(f"ignored {old} (older than step 12)") for note in resumed.notes)


CRAFTED: dict[str, tuple[dict[str, Any], str]] = {
    "step text": ({"raw_step": "twelve"}, "its step field is invalid"),
    "step zero": ({"meta": lambda m: m.update(step=0), "raw_step": "0"}, "its step field is invalid"),
    "step not int": ({"meta": lambda m: m.update(step="12")}, "its step field is invalid"),
    "losses": ({"meta": lambda m: m.update(losses=[1.0])}, "its loss history does not cover its 12 steps"),
    "losses type": ({"meta": lambda m: m.update(losses="nan")}, "its loss history does not cover"),
    "rng": (
        {"tensors": lambda t: t.update({"rng/torch_cpu": torch.zeros(3, dtype=torch.uint8)})},
        "cannot restore its optimizer or RNG state",
    ),
    "rng missing": ({"tensors": lambda t: t.pop("rng/torch_cpu")}, "cannot restore"),
    "optimizer": ({"meta": lambda m: m.update(optim_scalars={"x/step": 1})}, "cannot restore"),
    "run hash": ({"meta": lambda m: m.update(run_sha256="0" * 64)}, "run record does not match the hash"),
    "format": (
        {"meta": lambda m: m.update(format="te_assembly.train/1")},
        "has format 'te_assembly.train/1'",
    ),
    "weights": (
        {"tensors": lambda t: t.update({"model/steps.fc1.basic_ops.0.weight": torch.zeros(3)})},
        r"steps\.fc1\.basic_ops\.0\.weight is \(3,\), the model has \(64, 16\)",
    ),
}


@pytest.mark.parametrize("case", list(CRAFTED))
def test_crafted_fields_with_valid_checksums_are_still_refused(
    small_plan: Plan, run_to_12: tuple[Path, list[float]], case: str
) -> None:
    out, _ = run_to_12
    newest = checkpoint_path(out, 12)
    changes, problem = CRAFTED[case]
    _craft(newest, **changes)
    with pytest.raises(CheckpointError, match=problem):
        train(small_plan, Target.of("reference", seed=7), _settings(out, steps=16, resume=True))


# --- the step inside is authoritative -------------------------------------------------------------


def test_a_renamed_checkpoint_keeps_its_step(small_plan: Plan, run_to_12: tuple[Path, list[float]]) -> None:
    out, full = run_to_12
    checkpoint_path(out, 12).rename(out / "ckpt-0000002.safetensors")  # would sort before step 4
    assert [s for s, _ in list_checkpoints(out)] == [4, 8, 12]
    resumed = train(small_plan, Target.of("reference", seed=7), _settings(out, steps=16, resume=True))
    assert resumed.start_step == 12 and resumed.losses == full
    assert "ckpt-0000002.safetensors holds step 12: the step stored inside the file is used" in resumed.notes


def test_step_counts_beyond_seven_digits(small_plan: Plan, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = build(small_plan, "reference")
    optimizer = make_optimizer(model.parameters(), _settings(tmp_path))
    meta = {"losses": [], "run": {}}
    paths = [
        save_checkpoint(tmp_path, step, model, optimizer, meta)
        for step in (9_999_999, 10_000_000, 123_456_789)
    ]
    assert [p.name for p in paths] == [
        "ckpt-9999999.safetensors",
        "ckpt-10000000.safetensors",
        "ckpt-123456789.safetensors",
    ]
    assert list_checkpoints(tmp_path) == [
        (9_999_999, paths[0]),
        (10_000_000, paths[1]),
        (123_456_789, paths[2]),
    ]
    assert resume_point(tmp_path)[0] == paths[2]
    assert load_checkpoint(paths[1], model, optimizer).step == 10_000_000


# --- what a run records and compares -------------------------------------------------------------


def test_resume_lists_every_difference_of_the_resolved_model(tmp_path: Path) -> None:
    plan = _plan(MOE)
    s = _settings(tmp_path, steps=4, stop_after=2, checkpoint_every=2)
    train(plan, Target.of("reference", seed=0), s)
    meta = read_header(checkpoint_path(tmp_path, 2)).meta
    assert meta["run"]["model"]["ops"][2]["args"]["aux_loss_coeff"] == 0.01  # resolved, defaults in
    assert meta["run_sha256"] == record_sha256(meta["run"])
    before = _bytes(tmp_path)
    resume = dataclasses.replace(s, resume=True)
    with pytest.raises(CheckpointError) as info:
        train(_plan([*MOE, "model.dims.top_k=1"]), Target.of("reference", seed=0), resume)
    message = str(info.value)
    for line in (
        "model.dims.top_k: checkpoint 2, now 1",
        "model.ops[2].args.top_k: checkpoint 2, now 1",
        "model.ops[3].args.top_k: checkpoint 2, now 1",
        "model.ops[7].args.top_k: checkpoint 2, now 1",
    ):
        assert f"\n  {line}\n" in message, message
    with pytest.raises(
        CheckpointError, match=r"\n  model\.ops\[2\]\.args\.aux_loss_coeff: checkpoint 0\.01, now 0\.02\n"
    ):
        train(_plan([*MOE, "+model.ops.2.args.aux_loss_coeff=0.02"]), Target.of("reference", seed=0), resume)
    with pytest.raises(
        CheckpointError, match=r"\n  model\.ops\[6\]\.args\.scale_bias: checkpoint True, now False\n"
    ):
        train(
            _plan([*MOE, "model.ops.6.args.scale_bias=false", "~model.ops.6.extra_inputs.scales"]),
            Target.of("reference", seed=0),
            resume,
        )
    assert _bytes(tmp_path) == before
    train(plan, Target.of("reference", seed=0), resume)  # the same model resumes


def test_resume_refuses_another_recipe(small_plan: Plan, tmp_path: Path) -> None:
    s = _settings(tmp_path, steps=4, stop_after=2, checkpoint_every=2)
    bf16 = {"name": "bf16", "kind": "none", "description": "prose is not compared"}
    # The reference engine ignores a recipe, but the run records it: another recipe is another run.
    train(small_plan, Target.of("reference", seed=0, recipe=bf16), s)
    resume = dataclasses.replace(s, resume=True)
    other = {"name": "fp8_delayed", "kind": "DelayedScaling", "amax_history_len": 16}
    with pytest.raises(CheckpointError) as info:
        train(small_plan, Target.of("reference", seed=0, recipe=other), resume)
    message = str(info.value)
    for line in (
        "recipe.name: checkpoint 'bf16', now 'fp8_delayed'",
        "recipe.amax_history_len: checkpoint (not recorded), now 16",
    ):
        assert f"\n  {line}" in message, message
    train(small_plan, Target.of("reference", seed=0, recipe={**bf16, "description": "other words"}), resume)


# --- writing never loses the last good state -------------------------------------------------------


def test_a_checkpoint_that_does_not_read_back_is_never_renamed_into_place(
    small_plan: Plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = _settings(tmp_path, steps=8, keep_checkpoints=1)
    train(small_plan, Target.of("reference", seed=0), dataclasses.replace(s, stop_after=4))
    before = _bytes(tmp_path)
    real = ckpt_module.save_file

    def silently_bad(tensors: dict[str, torch.Tensor], filename: str, metadata: dict[str, str]) -> None:
        real(tensors, filename, metadata=metadata)
        _flip(Path(filename), _tensor_offset(Path(filename)))  # the disk returns other bytes

    monkeypatch.setattr(ckpt_module, "save_file", silently_bad)
    with pytest.raises(
        CheckpointError, match=r"cannot write .*ckpt-0000008.*checksum|does not match its checksum"
    ):
        train(small_plan, Target.of("reference", seed=0), dataclasses.replace(s, resume=True))
    # keep_checkpoints=1, yet step 4 (the last good one) is still there, and so is every other file.
    _unchanged_but_metrics(before, _bytes(tmp_path), 8)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_disk_full_is_a_one_line_error_and_loses_nothing(
    small_plan: Plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors import SafetensorError

    s = _settings(tmp_path, steps=8)
    train(small_plan, Target.of("reference", seed=0), dataclasses.replace(s, stop_after=4))
    before = _bytes(tmp_path)

    def full(tensors: dict[str, torch.Tensor], filename: str, metadata: dict[str, str]) -> None:
        Path(filename).write_bytes(b"\x00" * 10)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(ckpt_module, "save_file", full)
    with pytest.raises(
        CheckpointError,
        match=r"cannot write .*ckpt-0000008\.safetensors: No space left on device \(any previous file",
    ):
        train(small_plan, Target.of("reference", seed=0), dataclasses.replace(s, resume=True))
    _unchanged_but_metrics(before, _bytes(tmp_path), 8)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def _file_size_limit(limit: int) -> Callable[[], None]:
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing us
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_cli_real_write_failure_through_safetensors(tmp_path: Path) -> None:
    """A real OS-level write failure inside safetensors' own writer (a file-size limit: what a full disk
    does to a write), through the CLI: exit 1, one line, the previous checkpoint intact."""
    args = [*TRAIN_ARGS, "train.steps=4", f"train.out_dir={tmp_path}"]
    ok = _cli([*args, "train.stop_after=2"])
    assert ok.communicate(timeout=180) and ok.returncode == 0
    before = _bytes(tmp_path)
    size = checkpoint_path(tmp_path, 2).stat().st_size
    proc = _cli([*args, "train.resume=true"], preexec_fn=_file_size_limit(size // 2))
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 1, (out, err)
    err = _one_line(err)
    assert (
        f"error: cannot write {checkpoint_path(tmp_path, 4)}: File too large (any previous file is intact)"
        in err
    )
    assert "Traceback" not in err + out
    _unchanged_but_metrics(before, _bytes(tmp_path), 4)


def test_non_finite_parameters_are_never_saved(
    small_plan: Plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = loop_module.make_optimizer

    def poisoning(params: Any, settings: TrainSettings) -> torch.optim.Optimizer:
        optimizer = real(params, settings)
        original = optimizer.step
        calls = {"n": 0}

        def step(*a: Any, **kw: Any) -> Any:
            out = original(*a, **kw)
            calls["n"] += 1
            if calls["n"] == 8:  # the update of step 8 overflows; the loss of step 8 was still finite
                with torch.no_grad():
                    optimizer.param_groups[0]["params"][1].view(-1)[0] = float("inf")
            return out

        optimizer.step = step  # type: ignore[method-assign]
        return optimizer

    monkeypatch.setattr(loop_module, "make_optimizer", poisoning)
    with pytest.raises(
        NonFiniteError, match=r"non-finite value in parameter steps\..* after step 8: not saved"
    ):
        train(small_plan, Target.of("reference", seed=0), _settings(tmp_path, steps=12))
    assert [s for s, _ in list_checkpoints(tmp_path)] == [4]


# --- train.overwrite -------------------------------------------------------------------------------


def test_overwrite_keeps_the_old_run_until_the_new_one_has_a_checkpoint(
    small_plan: Plan, tmp_path: Path
) -> None:
    old = _settings(tmp_path, steps=6)
    train(small_plan, Target.of("reference", seed=0), old, config={"marker": "old run"})
    before = _bytes(tmp_path)
    assert {"metrics.jsonl", "config.yaml"} <= set(before)
    failing = _settings(tmp_path, steps=8, overwrite=True, inject_nan_at_step=3, lr=1e-2)
    with pytest.raises(NonFiniteError):
        train(
            small_plan, Target.of("reference", seed=1), failing, config={"marker": "new run"}
        )  # fails before its checkpoint 4
    assert _bytes(tmp_path) == before  # its metrics and config waited for that checkpoint
    result = train(
        small_plan,
        Target.of("reference", seed=1),
        dataclasses.replace(failing, inject_nan_at_step=None),
        config={},
    )
    assert [s for s, _ in list_checkpoints(tmp_path)] == [4, 8]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in records] == result.losses and len(records) == 8
    assert "old run" not in (tmp_path / "config.yaml").read_text()
    assert all(read_header(p).meta["seed"] == 1 for _, p in list_checkpoints(tmp_path))


def test_fresh_start_counts_unreadable_checkpoint_files(small_plan: Plan, tmp_path: Path) -> None:
    (tmp_path / "ckpt-0000004.safetensors").mkdir(parents=True)
    with pytest.raises(
        ExistingRunError, match=r"1 file\(s\) named like checkpoints that cannot be read \(.*is a directory"
    ):
        train(small_plan, Target.of("reference", seed=0), _settings(tmp_path, steps=2))


# --- models that cannot run, sizes that cannot fit ---------------------------------------------------

NO_PARAMS = [
    "model=channel_demo",
    "model.ops=[{name: s, op: Identity}, {name: c, op: ConstantScale, args: {scale: 2.0}}]",
]


def _cli_run(args: list[str]) -> tuple[int, str, str]:
    proc = _cli(args)
    out, err = proc.communicate(timeout=300)
    assert "Traceback" not in out + err, err
    return proc.returncode, _one_line(out), _one_line(err)


def _one_line(text: str) -> str:
    """Rich wraps piped output at 140 columns: compare messages with the wrapping undone."""
    return " ".join(text.split())


def test_a_model_without_parameters(tmp_path: Path) -> None:
    code, _, err = _cli_run(["train", *NO_PARAMS, "engine=reference", f"train.out_dir={tmp_path}"])
    assert code == 2 and "channel_demo has no parameters: there is nothing to train" in err
    assert not list(tmp_path.iterdir())
    code, out, _ = _cli_run(["bench", *NO_PARAMS, "engine=reference", "bench.repeats=2", "bench.warmup=1"])
    assert code == 0 and "has no parameters: backward computes the gradient of x" in out
    code, out, _ = _cli_run(["run", *NO_PARAMS, "engine=reference", "run.steps=2", "run.tokens=8"])
    assert code == 0 and "parameter-gradient norm 0" in out
    with pytest.raises(ConfigError, match="nothing to train"):
        train(_plan(NO_PARAMS), Target.of("reference", seed=0), _settings(tmp_path))


@pytest.mark.parametrize(
    ("command", "override", "what"),
    [
        ("run", "run.tokens=10000000000000", "running moe_block"),
        ("run", "model.dims.ffn=100000000000", "running moe_block"),
        ("bench", "bench.tokens=10000000000000", "benchmarking moe_block"),
        ("train", "train.batch_tokens=10000000000000", "training moe_block"),
        ("train", "model.dims.ffn=100000000000", "training moe_block"),
        ("verify", "run.tokens=10000000000000", "verifying moe_block"),
        ("run", "run.tokens=9000000000000000000", "running moe_block"),  # near the top of int64
    ],
)
def test_sizes_that_cannot_fit_are_refused_with_the_estimate(
    tmp_path: Path, command: str, override: str, what: str
) -> None:
    args = [command, "model=moe_block", "engine=reference", override, f"train.out_dir={tmp_path}"]
    if command == "verify":
        args[2] = "kernels=reference"
    code, _, err = _cli_run(args)
    if command == "verify" and "needs about" not in err:
        pytest.skip(f"verify needs TE here: {err.strip()}")
    assert code == 1, err
    assert (
        f"error: {what} needs about " in err and " is available (" in err and "Nothing was allocated" in err
    )


def test_sizes_beyond_int64_are_config_errors(tmp_path: Path) -> None:
    code, _, err = _cli_run(["run", "model=moe_block", "engine=reference", "run.tokens=10" + "0" * 22])
    assert code == 2, err
    assert "config.yaml:" in err and "error: run.tokens: tokens must be at most 2**63-1" in err
    assert "[set on the command line: run.tokens=1000" in err
    assert "Traceback" not in err


def test_cli_resume_with_another_top_k_lists_the_differences(tmp_path: Path) -> None:
    args = [
        "train",
        *MOE,
        "engine=reference",
        "train.steps=4",
        "train.batch_tokens=8",
        "train.plot=false",
        "train.checkpoint_every=2",
        f"train.out_dir={tmp_path}",
    ]
    code, _, _ = _cli_run([*args, "train.stop_after=2"])
    assert code == 0
    before = _bytes(tmp_path)
    code, _, err = _cli_run([*args, "train.resume=true", "model.dims.top_k=1"])
    assert code == 1
    assert "continuing would splice two runs" in err
    assert (
        "model.dims.top_k: checkpoint 2, now 1" in err
        and "model.ops[2].args.top_k: checkpoint 2, now 1" in err
    )
    assert _bytes(tmp_path) == before


def test_prune_never_deletes_the_last_good_checkpoint(run_to_12: tuple[Path, list[float]]) -> None:
    out, _ = run_to_12
    newest, good = checkpoint_path(out, 12), checkpoint_path(out, 8)
    _flip(newest, _tensor_offset(newest))  # readable header, corrupt data
    assert prune(out, keep=1) == [checkpoint_path(out, 4)]
    assert newest.exists() and good.exists()  # the corrupt one is not counted as good; 8 is kept
    verify(good)


# --- the loss history lives in metrics.jsonl ------------------------------------------------------


def _header_bytes(path: Path) -> int:
    return int.from_bytes(path.read_bytes()[:8], "little")


def test_checkpoints_do_not_grow_with_the_step_count(small_plan: Plan, tmp_path: Path) -> None:
    """Checkpoints at step 12 and step 40 of one run have headers of the same size: no per-step history.
    (Steps with as many digits: the step is written in the header, which safetensors pads to 8 bytes.)"""
    train(
        small_plan,
        Target.of("reference", seed=7),
        _settings(tmp_path, steps=40, checkpoint_every=4, keep_checkpoints=20),
    )
    sizes = {step: _header_bytes(path) for step, path in list_checkpoints(tmp_path)}
    assert sizes[12] == sizes[40], sizes


def test_a_resume_reads_the_loss_history_from_metrics(
    small_plan: Plan, run_to_12: tuple[Path, list[float]], tmp_path: Path
) -> None:
    out, full = run_to_12
    bare = tmp_path / "bare"
    shutil.copytree(out, bare)
    resumed = train(small_plan, Target.of("reference", seed=7), _settings(out, steps=16, resume=True))
    assert resumed.losses == full
    # with metrics.jsonl cut short the resume still continues exactly; the unknown losses are said
    metrics = bare / "metrics.jsonl"
    metrics.write_text("\n".join(metrics.read_text().splitlines()[:3]) + "\n")  # steps 1-3 only
    again = train(small_plan, Target.of("reference", seed=7), _settings(bare, steps=16, resume=True))
    assert again.losses[:3] == full[:3] and all(math.isnan(v) for v in again.losses[3:12])
    assert again.losses[12:] == full[12:]
    assert any("lacks the loss of 9 of the 12 steps" in n for n in again.notes)


def test_a_waiter_on_a_removed_lock_file_takes_the_new_one(tmp_path: Path) -> None:
    """The race removing the lock file opens, played out in order: B opens the lock file, A (the holder)
    removes it and ends, B locks the file it opened, which is no longer the lock. B must see that and
    lock the current file, so that C is refused while B runs."""
    a = RunLock(tmp_path).acquire()
    b = RunLock(tmp_path)
    stale = b._open()
    a.release()
    opened = iter([stale])
    fresh = b._open
    b._open = lambda: next(opened, None) or fresh()  # type: ignore[method-assign]
    b.acquire()
    try:
        with pytest.raises(RunDirectoryInUseError):
            RunLock(tmp_path).acquire()
    finally:
        b.release()
