"""Checkpoints of sharded runs (``parallel.shard``): PyTorch's distributed checkpoint (DCP), written by
every rank at once and read back on any number of ranks.

A checkpoint is a directory ``ckpt-<step>.dcp/``: one safetensors file per rank (DCP's
``HuggingFaceStorageWriter``: each tensor piece with its offset in the header, no pickle anywhere) and
``checkpoint.json``, rank 0's manifest: the step, the run record, every rank's RNG state, and the size
and SHA-256 of every file, the manifest itself checksummed. Tensors are named as in a single-process
checkpoint (``model/<name>``, ``optim/<param index>/<slot>``), so DCP reshards either kind onto any
layout: a sharded run reads a single-process ``.safetensors`` checkpoint, one process reads a sharded
one (``parallel.shard=2`` -> 1 and back).

Every rank writes into a hidden temporary directory; once all have written, rank 0 checksums the
files, writes the manifest, fsyncs and renames the directory into place. A run killed while saving
leaves only the temporary directory, never read and removed by the next run that holds the lock.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from te_assembly.engines.parallel.context import ParallelContext
from te_assembly.engines.parallel.pieces import local_piece
from te_assembly.errors import CheckpointError, NonFiniteError, first_line
from te_assembly.files import write
from te_assembly.files.read import LIMITS, InputFileError, read_json, sha256_file
from te_assembly.formats.checkpoint.state import adapter_names

DIR_SUFFIX = ".dcp"
MANIFEST = "checkpoint.json"
FORMAT = "te_assembly.train.dcp/1"


def checkpoint_dir(out_dir: Path, step: int) -> Path:
    return out_dir / f"ckpt-{step:07d}{DIR_SUFFIX}"


def is_sharded_checkpoint(path: Path) -> bool:
    return path.name.endswith(DIR_SUFFIX) and path.is_dir() and not path.is_symlink()


# ---------------------------------------------------------------------------------------- the state


def flat_state(
    par: ParallelContext, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Model and optimizer state as DCP sees them (``DTensor`` pieces under FSDP2, whole tensors
    otherwise) under a single-process checkpoint's names (an expert rank's ``weight0`` is its first
    expert's global name); and the optimizer's state dict by parameter name
    (``torch.distributed.checkpoint.state_dict``), to load into."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    frozen = StateDictOptions(ignore_frozen_params=bool(adapter_names(model)))  # only adapters train
    model_state, optim_state = get_state_dict(model, optimizer, options=frozen)
    optim_state = dict(optim_state)  # parameter name -> {slot: value}, and param_groups
    names, index = par.local_to_global, par.optimizer_index(model)
    flat = {f"model/{names.get(k, k)}": v for k, v in model_state.items() if isinstance(v, torch.Tensor)}
    states: dict[str, dict[str, Any]] = optim_state["state"]  # type: ignore[assignment]
    for name, entry in states.items():
        for slot, value in entry.items():
            if isinstance(value, torch.Tensor):
                flat[f"optim/{index[names.get(name, name)]}/{slot}"] = value
    return flat, optim_state


def _restore(
    par: ParallelContext,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    flat: Mapping[str, torch.Tensor],
    optim_state: dict[str, Any],
) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    local = {key: name for name, key in par.local_to_global.items()}
    index = par.optimizer_index(model)
    by_index = {index[par.local_to_global.get(n, n)]: n for n in optim_state["state"]}
    model_state = {}
    for key, value in flat.items():
        if key.startswith("model/"):
            name = key.removeprefix("model/")
            model_state[local.get(name, name)] = value
        elif key.startswith("optim/"):
            _, i, slot = key.split("/", 2)
            optim_state["state"][by_index[int(i)]][slot] = value
    partial = StateDictOptions(strict=not adapter_names(model))  # adapters only: the base stays as loaded
    given: Any = model_state  # set_state_dict's annotation is narrower than the tensors it takes
    set_state_dict(model, optimizer, model_state_dict=given, optim_state_dict=optim_state, options=partial)


def check_finite(par: ParallelContext, step: int, flat: Mapping[str, torch.Tensor]) -> None:
    """``NonFiniteError`` on every rank when any rank's piece of a parameter is NaN/Inf."""
    bad = next(
        (
            k.removeprefix("model/")
            for k, v in flat.items()
            if k.startswith("model/")
            and v.is_floating_point()
            and not bool(torch.isfinite(local_piece(v)).all())
        ),
        None,
    )
    if par.all_agree(bad is None):
        return
    name = bad or "a parameter on another rank"
    raise NonFiniteError(
        step,
        name,
        f"non-finite value in {name} after step {step}: not saved (the last checkpoint is the last good "
        "state)",
    )


# ---------------------------------------------------------------------------------------- integrity


def _corrupt(path: str, problem: str, code: str, line: int | None) -> CheckpointError:
    return CheckpointError(f"{path} is unreadable: {problem}")


def _sha256(path: Path) -> str:
    return sha256_file(path, within=path.parent, make_error=_corrupt)


def _files(directory: Path) -> dict[str, dict[str, Any]]:
    return {
        p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(directory.iterdir())
        if p.name != MANIFEST and p.is_file()
    }


def read_manifest(path: Path) -> dict[str, Any]:
    """The checked manifest of the sharded checkpoint ``path`` (its own checksum, format and step);
    ``CheckpointError`` for anything else."""
    try:
        raw = read_json(path / MANIFEST, limit=LIMITS["metadata"], within=path)
    except InputFileError as exc:
        if exc.code == "no-such-file":
            raise CheckpointError(f"{path} is not a complete sharded checkpoint (no {MANIFEST})") from None
        raise CheckpointError(f"{path} is corrupt: {MANIFEST} is unreadable ({exc.problem})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("meta"), str):
        raise CheckpointError(f"{path} is corrupt: {MANIFEST} is not a te_assembly manifest")
    if raw.get("sha256") != hashlib.sha256(raw["meta"].encode()).hexdigest():
        raise CheckpointError(f"{path} is corrupt: {MANIFEST} does not match the checksum recorded with it")
    meta = json.loads(raw["meta"])
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise CheckpointError(f"{path} has format {found!r}, this te_assembly reads {FORMAT!r}")
    step = meta.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise CheckpointError(f"{path} is corrupt: its step field is invalid ({step!r})")
    return meta


def verify_files(path: Path, meta: Mapping[str, Any]) -> None:
    """Every file the manifest lists is there with its size and SHA-256, and no other."""
    recorded = meta.get("files")
    if not isinstance(recorded, dict):
        raise CheckpointError(f"{path} is corrupt: its manifest lists no files")
    present = {p.name for p in path.iterdir() if p.name != MANIFEST}
    if present != set(recorded):
        missing, extra = sorted(set(recorded) - present), sorted(present - set(recorded))
        raise CheckpointError(
            f"{path} is corrupt: files missing {missing or 'none'}, unexpected {extra or 'none'}"
        )
    for name, entry in recorded.items():
        file = path / name
        if not file.is_file() or file.is_symlink():
            raise CheckpointError(f"{path} is corrupt: {name} is not a regular file")
        if file.stat().st_size != entry.get("bytes") or _sha256(file) != entry.get("sha256"):
            raise CheckpointError(f"{path} is corrupt: {name} does not match its checksum")


# ------------------------------------------------------------------------------------------- saving


def rng_states(par: ParallelContext) -> list[str]:
    """Every rank's torch RNG state (base64), on every rank."""
    mine = base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()
    if not par.is_parallel:
        return [mine]
    assert par.mesh is not None
    gathered: list[Any] = [None] * par.mesh.world_size
    dist.all_gather_object(gathered, mine)
    return [str(s) for s in gathered]


def save(
    par: ParallelContext,
    out_dir: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    meta: Mapping[str, Any],
) -> Path | None:
    """Every rank calls this; rank 0 returns ``ckpt-<step>.dcp`` once it is complete and in place, the
    others None. Raises ``NonFiniteError`` (on every rank, nothing written) for a NaN/Inf parameter and
    ``CheckpointError`` when the directory cannot be written (earlier checkpoints intact)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    flat, temp, rng = begin_write(par, out_dir, step, model, optimizer)
    problem: str | None = None
    try:
        dcp.save(flat, storage_writer=HuggingFaceStorageWriter(str(temp), save_distributed=True))
    except (OSError, RuntimeError, ValueError) as exc:
        problem = first_line(exc)
    check_written(par, temp, checkpoint_dir(out_dir, step), problem)
    par.barrier()  # every rank's file is written
    final: Path | None = None
    if par.is_main:
        final = seal(temp, checkpoint_dir(out_dir, step), step, meta, par, rng)
    par.barrier()
    return final


def begin_write(
    par: ParallelContext,
    out_dir: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
) -> tuple[dict[str, torch.Tensor], Path, list[str]]:
    """What every rank needs before it writes ``ckpt-<step>.dcp`` (at once or in the background): the
    state as DCP sees it, checked finite on every rank (``NonFiniteError``, nothing written), rank 0's
    hidden temporary directory and every rank's RNG state."""
    flat, _ = flat_state(par, model, optimizer)
    check_finite(par, step, flat)
    temp = out_dir / par.from_main(f".ckpt-{step:07d}{DIR_SUFFIX}.{uuid.uuid4().hex[:8]}{write.TEMP_SUFFIX}")
    return flat, temp, rng_states(par)


def check_written(par: ParallelContext, temp: Path, final: Path, problem: str | None) -> None:
    """Every rank's write of ``temp`` has ended, ``problem`` saying why this rank's failed:
    ``CheckpointError`` on every rank when any rank's did (the temporary directory removed, earlier
    checkpoints intact)."""
    if par.all_agree(problem is None):
        return
    par.barrier()
    if par.is_main:
        shutil.rmtree(temp, ignore_errors=True)
    raise CheckpointError(
        f"cannot write {final}: {problem or 'another rank failed'} (any previous checkpoint is intact)"
    )


def seal(
    temp: Path, final: Path, step: int, meta: Mapping[str, Any], par: ParallelContext, rng: list[str]
) -> Path:
    """Rank 0: the manifest written, everything fsynced, the directory renamed into place."""
    try:
        for file in temp.iterdir():
            with open(file, "rb") as f:
                os.fsync(f.fileno())
        record = {
            **meta,
            "format": FORMAT,
            "step": step,
            "parallel": {**par.settings.sizes(), "rng": rng},
            "files": _files(temp),
        }
        raw = json.dumps(record)
        manifest = {"meta": raw, "sha256": hashlib.sha256(raw.encode()).hexdigest()}
        write.write_text_atomic(temp / MANIFEST, json.dumps(manifest))
        write.fsync_dir(temp)
        if final.exists():  # this step written again (a resume from an older checkpoint)
            old = final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}{write.TEMP_SUFFIX}")
            os.replace(final, old)
            os.replace(temp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(temp, final)
        write.fsync_dir(final.parent)
    except OSError as exc:
        shutil.rmtree(temp, ignore_errors=True)
        raise CheckpointError(
            f"cannot write {final}: {exc.strerror or exc} (any previous checkpoint is intact)"
        ) from None
    return final


# ------------------------------------------------------------------------------------------ loading


@contextlib.contextmanager
def _reader(path: Path) -> Iterator[Any]:
    """DCP's safetensors reader over ``path``: a sharded checkpoint's directory, or a single-process
    checkpoint file seen as a directory of one file (its tensors whole, at offset 0)."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    if path.is_dir():
        yield HuggingFaceStorageReader(str(path))
        return
    with tempfile.TemporaryDirectory(prefix="te_assembly-ckpt-") as view:
        (Path(view) / "model.safetensors").symlink_to(path.resolve())
        yield HuggingFaceStorageReader(view)


def load_into(
    par: ParallelContext, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """Restore model and optimizer state from ``path`` (a verified sharded checkpoint, or a verified
    single-process checkpoint file), resharded by DCP onto this run's layout. Every rank calls it."""
    import torch.distributed.checkpoint as dcp

    flat, optim_state = flat_state(par, model, optimizer)
    try:
        with _reader(path) as reader, _quiet():
            dcp.load(flat, storage_reader=reader)
        _restore(par, model, optimizer, flat, optim_state)
    except (KeyError, ValueError, RuntimeError) as exc:
        first = first_line(exc)
        raise CheckpointError(f"{path} does not fit this model and optimizer ({first[:300]})") from None


def restore_rng(meta: Mapping[str, Any], par: ParallelContext) -> bool:
    """This rank's RNG state from a sharded checkpoint written by the same layout; False otherwise."""
    recorded = meta.get("parallel")
    if not isinstance(recorded, Mapping):
        return False
    states = recorded.get("rng")
    same = all(int(recorded.get(k, 1)) == v for k, v in par.settings.sizes().items())
    if not same or not isinstance(states, list) or len(states) != par.settings.world_size:
        return False
    raw = base64.b64decode(states[par.rank])
    torch.set_rng_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
    return True


def model_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A verified sharded checkpoint's model state, gathered whole in this process (``export``,
    ``from_checkpoint``)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    reader = HuggingFaceStorageReader(str(path))
    entries = reader.read_metadata().state_dict_metadata
    state = {
        k: torch.empty(tuple(m.size), dtype=m.properties.dtype)  # type: ignore[union-attr]
        for k, m in entries.items()
        if k.startswith("model/")
    }
    with _quiet():
        dcp.load(state, storage_reader=HuggingFaceStorageReader(str(path)))
    return {k.removeprefix("model/"): v for k, v in state.items()}


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """DCP warns that it loads in a single process when no process group exists: that is the intent."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process.*")
        yield


__all__ = [
    "DIR_SUFFIX",
    "FORMAT",
    "MANIFEST",
    "begin_write",
    "check_finite",
    "check_written",
    "checkpoint_dir",
    "flat_state",
    "is_sharded_checkpoint",
    "load_into",
    "model_tensors",
    "read_manifest",
    "restore_rng",
    "rng_states",
    "save",
    "seal",
    "verify_files",
]
