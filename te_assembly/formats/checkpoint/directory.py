"""The checkpoints of a run directory: found by their headers (a renamed file keeps its step), the newest
one that verifies, stale temporary files, pruning that never deletes the last good state."""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path

from te_assembly.errors import CheckpointError
from te_assembly.files import write
from te_assembly.formats.checkpoint import sharded
from te_assembly.formats.checkpoint.file import SUFFIX, Header, name_step, read_header, verify


@dataclass(frozen=True)
class Found:
    """A file in a run directory that should be a checkpoint, and what its header says."""

    path: Path
    header: Header | None
    problem: str | None

    @property
    def step(self) -> int | None:
        return self.header.step if self.header is not None else None


def scan(out_dir: Path) -> list[Found]:
    """Every ``*.safetensors`` entry of ``out_dir`` and every sharded checkpoint directory (``*.dcp``),
    hidden temp files aside, its header read and checked; readable ones first, by the step stored inside
    (not the file name), then the rest."""
    if not out_dir.is_dir():
        return []
    found = []
    for path in out_dir.iterdir():
        if path.name.startswith(".") or not path.name.endswith((SUFFIX, sharded.DIR_SUFFIX)):
            continue
        try:
            found.append(Found(path, read_header(path), None))
        except CheckpointError as exc:
            found.append(Found(path, None, str(exc)))
    return sorted(found, key=lambda f: (f.header is None, f.step or 0, f.path.name))


def newest_good(found: list[Found]) -> tuple[Header | None, list[str], list[str]]:
    """The newest checkpoint of ``found`` (``scan``) that verifies, the problems of every newer or
    unreadable one, and notes on older unreadable ones (ignored)."""
    problems: list[str] = []
    good = None
    for f in reversed([f for f in found if f.header is not None]):
        try:
            good = verify(f.path)
            break
        except CheckpointError as exc:
            problems.append(str(exc))
    notes: list[str] = []
    for f in found:
        if f.header is None:
            hinted = name_step(f.path)
            if good is not None and hinted is not None and hinted < good.step:
                notes.append(f"ignored {f.path} (older than step {good.step}): {f.problem}")
            else:
                problems.append(str(f.problem))
    return good, problems, notes


def list_checkpoints(out_dir: Path) -> list[tuple[int, Path]]:
    """Readable checkpoints as (step stored inside, path), oldest first."""
    return [(f.header.step, f.path) for f in scan(out_dir) if f.header is not None]


def remove_stale_temp(out_dir: Path) -> list[Path]:
    """Delete temporary files a crashed write left behind. Only call it while holding the directory's
    lock (``run_dir.RunLock``): a live run's temp file is not stale."""
    if not out_dir.is_dir():
        return []
    stale = [p for p in out_dir.iterdir() if p.name.startswith(".") and p.name.endswith(write.TEMP_SUFFIX)]
    for p in stale:
        remove_entry(p)
    return stale


def remove_entry(path: Path) -> None:
    """Delete a checkpoint file, or a sharded checkpoint's (or a temporary) directory; gone is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def prune(out_dir: Path, keep: int, latest: Path | None = None, run_sha256: str | None = None) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints (by the step inside). The last good checkpoint is
    never deleted: ``latest`` (the one just written and verified) or, when not given, the newest one
    whose every tensor verifies. Unreadable files and other runs' checkpoints (another ``run_sha256``)
    are not touched."""
    ours = [
        f
        for f in scan(out_dir)
        if f.header is not None and (run_sha256 is None or f.header.meta.get("run_sha256") == run_sha256)
    ]
    if latest is None:
        latest = next((f.path for f in reversed(ours) if _verifies(f.path)), None)
    if latest is None:
        return []  # no good checkpoint: nothing may go
    last = next((f for f in ours if f.path == latest), None)
    # Only checkpoints older than the last good one are pruned: anything newer is either corrupt (kept
    # for the user to see) or from a run being resumed from an older checkpoint (rewritten as it goes).
    limit = last.step if last is not None and last.step is not None else None
    older = [f for f in ours if f.path != latest and (limit is None or (f.step or 0) < limit)]
    doomed = [f.path for f in older[: max(0, len(older) - max(keep - 1, 0))]]
    for p in doomed:
        remove_entry(p)
    return doomed


def _verifies(path: Path) -> bool:
    try:
        verify(path)
    except CheckpointError:
        return False
    return True
