"""One guarded directory writer for every command that writes a directory: whatever DEST names, nothing
te_assembly did not write is ever deleted, a source is never written over, into or around, a run is never
replaced, and a crash at any instant leaves the old or the new directory under DEST's name (or a copy the
next command puts back, saying so)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import te_assembly
from te_assembly.errors import OutputPathError
from te_assembly.files.directory import MANIFEST, PRETRAINED, recover, write_directory
from tests.conftest import REPO_ROOT
from tests.engines._helpers import build_yaml
from tests.hostile.conftest import clean_failure, tree, user_cli

TINY = """
name: tiny
in_features: 8
ops:
  - {name: fc, op: Linear, args: {in_features: 8, out_features: 8}}
"""


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory, hf_llama: Path) -> dict[str, Path]:
    """A training run, a pretrained directory exported from it, an import of a Hugging Face checkpoint."""
    root = tmp_path_factory.mktemp("sources")
    done = user_cli(
        root, "train", "model=residual_mlp", "train.steps=2", "train.batch_tokens=32", "train.out_dir=run"
    )
    assert done.returncode == 0, done.stderr
    te_assembly.export_checkpoint(root / "run", root / "pre")
    te_assembly.import_hf(hf_llama, root / "imported")
    return {"run": root / "run", "pre": root / "pre", "imported": root / "imported", "hf": hf_llama}


@dataclass(frozen=True)
class Writer:
    source: str | None
    """Which of ``sources`` it reads (None: a model in memory)."""
    write: Callable[[dict[str, Path], Path], object]


WRITERS = {
    "save_pretrained": Writer(
        None, lambda s, d: te_assembly.save_pretrained(build_yaml(TINY), d, overwrite=True)
    ),
    "export (te)": Writer("run", lambda s, d: te_assembly.export_checkpoint(s["run"], d, overwrite=True)),
    "export format=hf (a run)": Writer(
        "run",
        lambda s, d: __import__("te_assembly.formats.hf.convert").formats.hf.convert.export_hf(
            s["run"], d, overwrite=True
        ),
    ),
    "export format=hf (a pretrained directory)": Writer(
        "imported",
        lambda s, d: __import__("te_assembly.formats.hf.convert").formats.hf.convert.export_hf(
            s["imported"], d, overwrite=True
        ),
    ),
    "import-hf": Writer("hf", lambda s, d: te_assembly.import_hf(s["hf"], d, overwrite=True)),
}


def _in_use(kind: str) -> Callable[[Path], None]:
    def make(dest: Path) -> None:
        dest.mkdir(parents=True)
        if kind == "dcp":
            (dest / "ckpt-0000004.dcp").mkdir()
            (dest / "ckpt-0000004.dcp" / ".metadata").write_bytes(b"pieces")
        elif kind == "checkpoint":
            (dest / "ckpt-4.safetensors").write_bytes(b"weights")
        elif kind == "lock":
            (dest / ".te_assembly.lock").write_text("{}")
        elif kind == "metrics":
            (dest / "metrics.jsonl").write_text('{"step": 1}\n')
        elif kind == "notes":
            (dest / "notes.txt").write_text("mine")
            (dest / "runs").mkdir()
            (dest / "runs" / "ckpt-9.safetensors").write_bytes(b"older run")

    return make


DESTS = {
    "holds a run's DCP checkpoint": _in_use("dcp"),
    "holds a run's checkpoint": _in_use("checkpoint"),
    "holds a run's lock": _in_use("lock"),
    "holds a run's metrics": _in_use("metrics"),
    "holds the user's notes and runs": _in_use("notes"),
}


@pytest.mark.parametrize("writer", WRITERS, ids=list(WRITERS))
@pytest.mark.parametrize("dest", DESTS, ids=list(DESTS))
def test_overwrite_never_replaces_what_te_assembly_did_not_write(
    writer: str, dest: str, sources: dict[str, Path], tmp_path: Path
) -> None:
    target = tmp_path / "dest"
    DESTS[dest](target)
    before = tree(tmp_path)
    with pytest.raises(OutputPathError, match="refusing to write"):
        WRITERS[writer].write(sources, target)
    assert tree(tmp_path) == before


OVERLAPS = {
    "is the source": lambda src: src,
    "is inside the source": lambda src: src / "sub",
    "contains the source": lambda src: src.parent,
}


@pytest.mark.parametrize("writer", [w for w in WRITERS if WRITERS[w].source is not None])
@pytest.mark.parametrize("overlap", OVERLAPS, ids=list(OVERLAPS))
def test_dest_never_is_contains_or_is_inside_the_source(
    writer: str, overlap: str, sources: dict[str, Path]
) -> None:
    name = WRITERS[writer].source
    assert name is not None
    source = sources[name]
    read_from = source / "ckpt-2.safetensors" if name == "run" else source
    if name == "run":
        read_from = next(p for p in source.iterdir() if p.name.startswith("ckpt-"))
    target = OVERLAPS[overlap](read_from)
    before = tree(source.parent)
    with pytest.raises(OutputPathError, match=r"refusing to write|holds a training run"):
        WRITERS[writer].write(sources, target)
    assert tree(source.parent) == before


def test_overwrite_replaces_a_directory_te_assembly_wrote_as_that_kind(tmp_path: Path) -> None:
    model = build_yaml(TINY)
    dest = te_assembly.save_pretrained(model, tmp_path / "pre")
    manifest = json.loads((dest / MANIFEST).read_text())
    assert manifest["kind"] == "pretrained" and "model.safetensors" in manifest["files"]
    assert sorted(manifest["files"]) == sorted(p.name for p in dest.iterdir() if p.name != MANIFEST)
    te_assembly.save_pretrained(model, dest, overwrite=True)  # its own kind: replaced
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / MANIFEST).write_text(json.dumps({"kind": "hf", "files": []}))
    with pytest.raises(OutputPathError, match="not a pretrained model directory"):
        te_assembly.save_pretrained(model, hf, overwrite=True)


def test_a_directory_written_before_manifests_is_recognised_by_its_layout(tmp_path: Path) -> None:
    dest = te_assembly.save_pretrained(build_yaml(TINY), tmp_path / "pre")
    (dest / MANIFEST).unlink()  # as an older te_assembly wrote it
    te_assembly.save_pretrained(build_yaml(TINY), dest, overwrite=True)
    assert (dest / MANIFEST).is_file()


def test_export_over_the_folder_it_runs_in_is_a_clean_refusal(
    sources: dict[str, Path], tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "keep.txt").write_text("mine")
    done = user_cli(work, "export", str(sources["run"]), ".", "export.overwrite=true")
    clean_failure(done, 1, "refusing to write")
    assert (work / "keep.txt").read_text() == "mine"


# --- crashes -----------------------------------------------------------------------------------------

CRASHER = """
import os, sys
from pathlib import Path
from te_assembly.files import directory

crash_at, dest, exchange = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "1"
calls = [0]
real_rename = os.rename

def rename(a, b):
    calls[0] += 1
    if calls[0] == crash_at:
        os._exit(9)  # killed here
    real_rename(a, b)

directory.os.rename = rename
if not exchange:
    directory._exchange = lambda a, b: False
else:
    real_exchange = directory._exchange
    def exchange_then_die(a, b):
        calls[0] += 1
        if calls[0] == crash_at:
            os._exit(9)
        done = real_exchange(a, b)
        calls[0] += 1
        if calls[0] == crash_at:
            os._exit(9)
        return done
    directory._exchange = exchange_then_die

def fill(staging):
    (staging / "data.txt").write_text("new")

directory.write_directory(dest, directory.PRETRAINED, fill, overwrite=True)
"""


def _old(dest: Path) -> None:
    def fill(staging: Path) -> None:
        (staging / "data.txt").write_text("old")

    write_directory(dest, PRETRAINED, fill)


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "two-renames"])
@pytest.mark.parametrize("crash_at", [1, 2, 3])
def test_a_crash_at_any_instant_leaves_the_old_or_the_new_directory(
    crash_at: int, exchange: bool, tmp_path: Path
) -> None:
    dest = tmp_path / "dest"
    _old(dest)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    subprocess.run(
        [sys.executable, "-c", CRASHER, str(crash_at), str(dest), "1" if exchange else "0"],
        env=env,
        check=False,
        timeout=120,
    )
    said = recover(dest)  # what the next command that writes or reads DEST does first
    assert (dest / "data.txt").read_text() in ("old", "new")
    assert (dest / MANIFEST).is_file()
    if said is not None:
        assert "interrupted" in said and "back in place" in said
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".old")]


def test_the_next_command_puts_an_interrupted_overwrite_back_and_says_so(
    sources: dict[str, Path], tmp_path: Path
) -> None:
    dest = tmp_path / "pre"
    te_assembly.export_checkpoint(sources["run"], dest)
    os.rename(dest, tmp_path / ".pre.0a1b2c3d.old")  # the state a kill between the two renames leaves
    done = user_cli(
        tmp_path, "generate", "generate.source=pre", "generate.max_new_tokens=1", "model=residual_mlp"
    )
    assert "back in place" in done.stderr, done.stderr
    assert (dest / "model.safetensors").is_file()


ADDED_BY_THE_USER = {
    "a file beside the weights": lambda d: (d / "notes.txt").write_text("mine"),
    "a file in a folder of its own": lambda d: (
        (d / "mine").mkdir() or (d / "mine" / "eval.json").write_text("{}")
    ),
    "a hidden file": lambda d: (d / ".env").write_text("KEY=1"),
    "a symlink": lambda d: (d / "data").symlink_to(d.parent),
    "a file in a folder te_assembly wrote": lambda d: (
        next(p for p in d.iterdir() if p.is_dir()).joinpath("extra.yaml").write_text("mine: 1\n")
    ),
}


WRITING = [w for w in WRITERS if w != "export format=hf (a run)"]  # the run's model has no HF equivalent
WITH_FOLDERS = ("import-hf",)  # it writes model/ and block/ beside the weights
ADDITIONS = [
    pytest.param(writer, added, id=f"{added}-{writer}")
    for writer in WRITING
    for added in ADDED_BY_THE_USER
    if added != "a file in a folder te_assembly wrote" or writer in WITH_FOLDERS
]


@pytest.mark.parametrize(("writer", "added"), ADDITIONS)
def test_overwrite_refuses_over_files_added_to_a_directory_te_assembly_wrote(
    writer: str, added: str, sources: dict[str, Path], tmp_path: Path
) -> None:
    """The manifest lists what te_assembly wrote; anything added afterwards is the user's: an overwrite
    refuses, naming it, and changes nothing; once it is gone the same overwrite goes through."""
    target = tmp_path / "dest"
    WRITERS[writer].write(sources, target)
    ADDED_BY_THE_USER[added](target)
    user_files = set(tree(target)) - set(json.loads((target / MANIFEST).read_text())["files"]) - {MANIFEST}
    assert user_files, "the attack added nothing the manifest does not list"
    before = tree(tmp_path)
    with pytest.raises(OutputPathError, match="did not write") as caught:
        WRITERS[writer].write(sources, target)
    assert tree(tmp_path) == before
    assert any(Path(f).name in str(caught.value) for f in user_files)
    for name in user_files:
        path = target / name
        path.unlink()
    WRITERS[writer].write(sources, target)
    assert not set(tree(target)) & user_files


# --- sources, changes under way, clean-up, concurrency --------------------------------------------------


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A LoRA run on a frozen base it was started from (``train.init_from``)."""
    import torch

    from te_assembly.jobs.train.settings import TrainSettings

    root = tmp_path_factory.mktemp("lora")
    base = te_assembly.save_pretrained(te_assembly.build("llama_tiny", "reference"), root / "base")
    plan = te_assembly.load("llama_tiny", ["lora.rank=2"]).checked_plan()
    settings = TrainSettings(
        steps=2,
        batch_tokens=2 * 16,
        seq_len=16,
        eval_every=0,
        plot=False,
        init_from=str(base),
        out_dir=str(root / "run"),
    )
    te_assembly.train(plan, te_assembly.Target.of("reference", dtype=torch.float32), settings)
    return {"base": base, "run": root / "run"}


@pytest.mark.parametrize("form", ["te", "te merged", "hf merged", "peft"])
def test_an_export_of_a_lora_run_never_writes_over_its_base(form: str, lora_run: dict[str, Path]) -> None:
    """The base is a source of the run as the run itself is: an export onto it, into it or around it is
    refused, overwrite or not, and the base is left as it was."""
    base, run = lora_run["base"], lora_run["run"]
    fmt, merged = form.split()[0], form.endswith("merged")
    before = tree(base.parent)
    for dest in (base, base / "inside"):
        args = ["export", str(run), str(dest), "export.overwrite=true", f"export.format={fmt}"]
        done = user_cli(base.parent, *args, *(["export.merge=true"] if merged else []))
        clean_failure(done, 1, "refusing to write", "the source")
        assert tree(base.parent) == before


def test_a_destination_made_while_the_work_runs_is_left_as_the_user_left_it(tmp_path: Path) -> None:
    dest = tmp_path / "dest"

    def fill(staging: Path) -> None:  # the user makes DEST while the import is under way
        dest.mkdir()
        (dest / "mine.txt").write_text("the user's")
        (staging / "data.txt").write_text("new")

    with pytest.raises(OutputPathError, match="not empty"):
        write_directory(dest, PRETRAINED, fill)
    assert tree(tmp_path) == {"dest/mine.txt": b"the user's"}
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((".saving", ".old"))]


def test_files_added_to_the_destination_while_the_work_runs_stop_the_overwrite(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    _old(dest)

    def fill(staging: Path) -> None:
        (dest / "notes.txt").write_text("added during the export")
        (staging / "data.txt").write_text("new")

    with pytest.raises(OutputPathError, match="did not write"):
        write_directory(dest, PRETRAINED, fill, overwrite=True)
    assert (dest / "data.txt").read_text() == "old"
    assert (dest / "notes.txt").read_text() == "added during the export"


def test_clean_up_removes_only_what_the_writer_made(tmp_path: Path) -> None:
    """Folders named as the writer names its own but not its own (a user's ``.pre.0a1b2c3d.old`` with
    their files) survive every write and every read of DEST; a stale staging folder of the writer's and
    an old copy holding nothing but what its manifest lists are removed."""
    dest = tmp_path / "pre"
    model = build_yaml(TINY)
    te_assembly.save_pretrained(model, dest)
    users = [tmp_path / ".pre.0a1b2c3d.old", tmp_path / ".pre.1b2c3d4e.saving", tmp_path / ".pre.x.old"]
    for folder in users:
        folder.mkdir()
        (folder / "thesis.tex").write_text("the user's")
    stale = tmp_path / ".pre.2c3d4e5f.saving"
    stale.mkdir()
    (stale / ".te_assembly.staging").write_text("1\n")
    (stale / "half.bin").write_bytes(b"half")
    ours_old = tmp_path / ".pre.3d4e5f60.old"
    shutil.copytree(dest, ours_old)
    te_assembly.from_pretrained(dest, "reference")  # a read recovers first
    te_assembly.save_pretrained(model, dest, overwrite=True)
    for folder in users:
        assert (folder / "thesis.tex").read_text() == "the user's"
    assert not stale.exists() and not ours_old.exists()


def test_a_second_writer_is_refused_while_the_first_holds_the_destination(tmp_path: Path) -> None:
    """Another writer at work (its lock held, its staging folder live): this one is refused, and neither
    DEST nor the other's staging folder is touched."""
    import fcntl

    dest = tmp_path / "dest"
    _old(dest)
    live = tmp_path / ".dest.4e5f6071.saving"
    live.mkdir()
    (live / ".te_assembly.staging").write_text("1\n")
    (live / "weights.bin").write_bytes(b"being written")
    lock = os.open(tmp_path / ".dest.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        before = tree(tmp_path)
        with pytest.raises(OutputPathError, match="another te_assembly command is writing it"):
            write_directory(dest, PRETRAINED, lambda s: (s / "data.txt").write_text("new"), overwrite=True)
        assert tree(tmp_path) == before
    finally:
        os.close(lock)
    write_directory(dest, PRETRAINED, lambda s: (s / "data.txt").write_text("new"), overwrite=True)
    assert (dest / "data.txt").read_text() == "new" and not live.exists()  # stale once its writer is gone


def test_every_file_an_export_writes_has_the_user_s_mode(tmp_path: Path) -> None:
    """A Hugging Face export's shards and a PEFT export's tensors get 0666 less the umask, as every
    other file te_assembly writes (safetensors alone writes 0600)."""
    import os
    import stat

    import torch

    import te_assembly
    from te_assembly.formats.adapters import adapter_plan, write_peft
    from te_assembly.formats.hf.convert import export_hf

    previous = os.umask(0o002)
    try:
        pre = te_assembly.save_pretrained(te_assembly.build("llama_tiny", "reference"), tmp_path / "pre")
        written = [
            export_hf(pre, tmp_path / "hf"),
            export_hf(pre, tmp_path / "sharded", max_shard_bytes=2**16),
        ]
        plan = adapter_plan(te_assembly.from_pretrained(pre, "reference").plan, {"rank": 2})
        model = te_assembly.Target.of("reference", dtype=torch.float32).build(plan)
        written.append(write_peft(plan, model.state_dict(), tmp_path / "peft"))
    finally:
        os.umask(previous)
    files = [p for folder in written for p in folder.iterdir()]
    assert sum(p.suffix == ".safetensors" for p in files) >= 4
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o664, path
