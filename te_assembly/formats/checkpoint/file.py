"""One process's checkpoint, a safetensors file: written atomically, checksummed, verified before anything
is trusted.

A checkpoint holds the model's state dict (``model/<name>``), the optimizer's tensor state
(``optim/<param index>/<key>``) and the RNG states (``rng/...``) as tensors; the step, the loss history,
the optimizer's non-tensor state, the run record and a SHA-256 of every tensor go in the safetensors
metadata as JSON (safetensors stores tensors only, and metadata values must be strings), and the
metadata JSON carries its own SHA-256. So a flipped byte anywhere (tensor data, metadata, the header's
shapes or offsets) and a truncated file are found before anything is loaded.

The step stored inside the file is authoritative: files are found by reading their headers, so a
renamed file keeps its step, and names carry as many digits as the step needs.

Writes go to a temporary file in the same directory, are fsynced, read back and verified, then
``os.replace``d over the final name (atomic on POSIX), and the directory is fsynced. A crash leaves
either the old file set or the new one, plus at most a ``.tmp`` file that is never read and is removed
by the next run that holds the directory's lock (``jobs/train/lock.py``). Parameters that are not finite are
never written.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from te_assembly.errors import CheckpointError, NonFiniteError, first_line
from te_assembly.files import write as files_write
from te_assembly.formats.checkpoint import sharded
from te_assembly.formats.checkpoint.state import adapter_names, checkpoint_state
from te_assembly.formats.tensor_file import open_safetensors

FORMAT = "te_assembly.train/2"
SUFFIX = ".safetensors"
_NAME = re.compile(r"^ckpt-(\d+)\.safetensors$")
_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass
class Checkpoint:
    path: Path
    step: int
    meta: dict[str, Any]


def checkpoint_path(out_dir: Path, step: int) -> Path:
    """``ckpt-0000042.safetensors``: zero-padded to 7 digits for sorting by eye, wider when needed."""
    return out_dir / f"ckpt-{step:07d}{SUFFIX}"


def free_checkpoint_path(out_dir: Path, step: int) -> Path:
    """Where step ``step``'s checkpoint goes: ``checkpoint_path``, unless a file there holds another
    step (renamed by hand) or is no checkpoint: that file is never overwritten, and the checkpoint takes
    the first free ``ckpt-<step>_<n>.safetensors`` (the step inside a file is what counts)."""
    path = checkpoint_path(out_dir, step)
    n = 0
    while path.exists() or path.is_symlink():
        try:
            if read_header(path).step == step:
                return path  # this step's own checkpoint, written again (replaced atomically)
        except CheckpointError:
            pass
        n += 1
        path = out_dir / f"ckpt-{step:07d}_{n}{SUFFIX}"
    return path


def name_step(path: Path) -> int | None:
    match = _NAME.match(path.name)
    return int(match.group(1)) if match else None


# --- reading -------------------------------------------------------------------------------------


def _not_a_checkpoint(path: str, problem: str, code: str, line: int | None) -> CheckpointError:
    if code == "not-a-file":  # "it is a FIFO (named pipe), not a regular file"
        problem = problem.removeprefix("it ").replace("a regular file", "a checkpoint file")
        return CheckpointError(f"{path} {problem}")
    return CheckpointError(f"cannot open {path}: {problem}")


@dataclass(frozen=True)
class Header:
    """A checkpoint's header as safetensors reads it, checked against what was recorded at save time
    (not its tensor data: see ``verify``)."""

    path: Path
    step: int
    meta: dict[str, Any]
    tensors: dict[str, dict[str, Any]]
    """Each tensor's ``dtype`` (safetensors' name, e.g. ``F32``) and ``shape``."""


def _corrupt(path: Path, what: str) -> CheckpointError:
    return CheckpointError(f"{path} is corrupt: {what}")


def _safe_open(path: Path, within: Path | None = None) -> contextlib.AbstractContextManager[Any]:
    """safetensors' handle on ``path`` through the one opener (``formats/tensor_file.py``): a FIFO, or a
    file swapped for one, is refused instead of blocking; whatever safetensors cannot parse is a
    ``CheckpointError`` saying why."""
    return open_safetensors(path, within=within, make_error=_not_a_checkpoint)


def _header(path: Path, handle: Any, fmt: str = FORMAT) -> Header:
    metadata = handle.metadata()
    what = "training checkpoint" if fmt == FORMAT else "weights file"
    if not isinstance(metadata, dict) or "te_assembly" not in metadata:
        raise CheckpointError(f"{path} is not a te_assembly {what} (no te_assembly metadata)")
    meta = _checked_meta(path, metadata)
    tensors = {}
    for name in handle.keys():
        view = handle.get_slice(name)
        tensors[name] = {"dtype": view.get_dtype(), "shape": list(view.get_shape())}
    if fmt != FORMAT:
        if meta.get("format") != fmt:
            raise CheckpointError(f"{path} has format {meta.get('format')!r}, this te_assembly reads {fmt!r}")
        return _checked_entries(path, tensors, meta, 0)
    if meta.get("format") != FORMAT:
        raise CheckpointError(
            f"{path} has format {meta.get('format')!r}, this te_assembly reads {FORMAT!r} (checkpoints of "
            "older versions carry no checksums and cannot be verified): start over with "
            "train.overwrite=true or use another train.out_dir"
        )
    step = meta.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 1 or str(step) != metadata.get("step"):
        raise _corrupt(path, f"its step field is invalid ({step!r})")
    return _checked_entries(path, tensors, meta, step)


def _checked_entries(
    path: Path, tensors: dict[str, dict[str, Any]], meta: dict[str, Any], step: int
) -> Header:
    recorded = meta.get("tensors")
    if not isinstance(recorded, dict) or set(recorded) != set(tensors):
        raise _corrupt(path, "its tensor list does not match the checksums recorded with it")
    for name, entry in tensors.items():
        saved = recorded[name]
        if not isinstance(saved, dict):
            raise _corrupt(path, f"tensor {name!r} has a malformed recorded entry")
        if entry["dtype"] != saved.get("dtype") or entry["shape"] != saved.get("shape"):
            raise _corrupt(path, f"tensor {name!r}: the header's dtype/shape differ from the recorded ones")
    return Header(path, step, meta, tensors)


def _checked_meta(path: Path, metadata: dict[str, Any]) -> dict[str, Any]:
    raw = metadata["te_assembly"]
    digest = metadata.get("te_assembly_sha256")
    if not isinstance(raw, str) or digest != hashlib.sha256(raw.encode()).hexdigest():
        raise _corrupt(path, "its metadata does not match the checksum recorded with it")
    try:
        meta = json.loads(raw)
    except ValueError:
        raise _corrupt(path, "its metadata is not valid JSON") from None
    if not isinstance(meta, dict):
        raise _corrupt(path, "its metadata is not a JSON object")
    return meta


def read_header(path: Path, fmt: str = FORMAT) -> Header:
    """The checked header of ``path``; ``CheckpointError`` for anything that is not a readable
    te_assembly checkpoint (a directory, a FIFO, a truncated or corrupt file, another format). ``fmt``:
    the format expected (training checkpoints by default; ``pretrained.py``'s weights files). A sharded
    run's checkpoint directory (``sharded.py``) has its manifest read."""
    if fmt == FORMAT and sharded.is_sharded_checkpoint(path):
        meta = sharded.read_manifest(path)
        return Header(path, meta["step"], meta, {})
    with _safe_open(path) as handle:
        return _header(path, handle, fmt)


def read_meta(path: Path) -> dict[str, Any]:
    return read_header(path).meta


def read_verified(
    path: Path, fmt: str = FORMAT, within: Path | None = None
) -> tuple[Header, dict[str, torch.Tensor]]:
    """Every tensor of ``path`` (CPU), each checked against the SHA-256 recorded at save time before
    any is returned (``CheckpointError`` first); ``within``: the folder it was found in."""
    with _safe_open(path, within) as handle:
        header = _header(path, handle, fmt)
        tensors = {}
        for name in header.tensors:
            tensor = handle.get_tensor(name)
            if _digest(tensor) != header.meta["tensors"][name].get("sha256"):
                raise _corrupt(path, f"tensor {name!r} does not match its checksum")
            tensors[name] = tensor
    return header, tensors


def verify(path: Path, fmt: str = FORMAT) -> Header:
    """Check ``path`` completely: header and every tensor's checksum (a sharded checkpoint: every
    file's)."""
    if fmt == FORMAT and sharded.is_sharded_checkpoint(path):
        header = read_header(path)
        sharded.verify_files(path, header.meta)
        return header
    return read_verified(path, fmt)[0]


def model_state(path: Path) -> tuple[Header, dict[str, torch.Tensor]]:
    """A training checkpoint's model state dict (the ``model/`` tensors under their plain names), verified
    (a sharded checkpoint's gathered whole)."""
    if sharded.is_sharded_checkpoint(path):
        return verify(path), sharded.model_tensors(path)
    header, tensors = read_verified(path)
    return header, {k.removeprefix("model/"): v for k, v in tensors.items() if k.startswith("model/")}


# --- writing -------------------------------------------------------------------------------------


def _write_problem(exc: BaseException) -> str | None:
    """A one-line reason for a failed write, or None when ``exc`` is not a write failure."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    if isinstance(exc, SafetensorError):
        # safetensors reports the OS error inside its own message: "I/O error: File too large (os error
        # 27)" or "IoError(Os { code: 28, ... })". A full disk is not an OSError here.
        text = str(exc)
        code = re.search(r"(?:code: |os error )(\d+)", text)
        return os.strerror(int(code.group(1))) if code else text.splitlines()[0] if text else "write failed"
    return None


def write_atomic(
    path: Path, write: Callable[[str], object], check: Callable[[str], object] | None = None
) -> None:
    """``files.write.write_atomic`` with a checkpoint's failures: a failed write (disk full, permissions,
    safetensors' own I/O error) is a ``CheckpointError``, any previous file intact."""
    files_write.write_atomic(path, write, check, problem_of=_write_problem, error=_checkpoint_error)


def _checkpoint_error(path: Path, problem: str) -> Exception:
    return CheckpointError(f"cannot write {path}: {problem} (any previous file is intact)")


def _rng_tensors() -> dict[str, torch.Tensor]:
    out = {"rng/torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            out[f"rng/cuda/{i}"] = state
    return out


def _digest(t: torch.Tensor) -> str:
    # The bytes safetensors writes: the contiguous CPU tensor's memory (little-endian machines).
    return hashlib.sha256(t.reshape(-1).view(torch.uint8).numpy()).hexdigest()  # type: ignore[arg-type]


def _dtype_name(dtype: torch.dtype) -> str:
    return next(name for name, d in _DTYPES.items() if d == dtype)


def check_finite(step: int, model: torch.nn.Module) -> None:
    """``NonFiniteError`` naming the first parameter (or floating buffer) with a NaN/Inf: such a model is
    never saved. Reads ``state_dict()`` only, so a gathered state standing in for a model works too."""
    for name, p in model.state_dict().items():
        if isinstance(p, torch.Tensor) and p.is_floating_point() and not bool(torch.isfinite(p).all()):
            raise NonFiniteError(
                step,
                name,
                f"non-finite value in parameter {name} after step {step}: not saved (the last checkpoint "
                "is the last good state)",
            )


def save_checkpoint(
    out_dir: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    meta: Mapping[str, Any],
) -> Path:
    """Write ``ckpt-<step>.safetensors`` atomically and verified; ``meta`` must be JSON-serialisable.
    Raises ``NonFiniteError`` (nothing written) when a parameter is NaN/Inf."""
    check_finite(step, model)
    tensors: dict[str, torch.Tensor] = {}
    for name, value in checkpoint_state(model).items():
        tensors[f"model/{name}"] = value.detach().to("cpu").contiguous().clone()
    optim_scalars: dict[str, Any] = {}
    for index, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim/{index}/{key}"] = value.detach().to("cpu").contiguous().clone()
            else:
                optim_scalars[f"{index}/{key}"] = value
    tensors.update(_rng_tensors())
    path = free_checkpoint_path(out_dir, step)
    meta = {**meta, "step": step, "optim_scalars": optim_scalars}
    return write_verified(path, tensors, meta, FORMAT, {"step": str(step)})


def write_verified(
    path: Path,
    tensors: Mapping[str, torch.Tensor],
    meta: Mapping[str, Any],
    fmt: str,
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Write ``tensors`` (contiguous, CPU) to ``path`` as safetensors, with ``meta`` (JSON) and every
    tensor's SHA-256 in its metadata, atomically, read back and verified (``write_atomic``). ``metadata``:
    more plain string entries of the header (other tools read ``format: pt``)."""
    checksums = {
        name: {"dtype": _dtype_name(t.dtype), "shape": list(t.shape), "sha256": _digest(t)}
        for name, t in tensors.items()
    }
    raw = json.dumps({**meta, "format": fmt, "tensors": checksums})
    digest = hashlib.sha256(raw.encode()).hexdigest()
    header = {**(metadata or {}), "te_assembly": raw, "te_assembly_sha256": digest}
    write_atomic(
        path, lambda tmp: save_file(dict(tensors), tmp, metadata=header), lambda tmp: verify(Path(tmp), fmt)
    )
    return path


# --- loading -------------------------------------------------------------------------------------


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Checkpoint:
    """Verify ``path`` completely, then restore model, optimizer and RNG states in place; return the step
    (the one stored inside) and metadata. Any problem is a ``CheckpointError`` and leaves the model as it
    was only if the problem is found before restoring (checksums and shapes are all checked first)."""
    header, tensors = read_verified(path)
    model_state = {k.removeprefix("model/"): v for k, v in tensors.items() if k.startswith("model/")}
    mine = checkpoint_state(model)
    if set(model_state) != set(mine):
        missing, extra = sorted(set(mine) - set(model_state)), sorted(set(model_state) - set(mine))
        raise CheckpointError(f"{path} does not fit this model: missing {missing}, unexpected {extra}")
    for name, value in model_state.items():
        # Shapes only: the run record already holds the dtype, and a model that stands in with meta
        # tensors for its global shapes (parallel runs) has no dtype to compare.
        if tuple(value.shape) != tuple(mine[name].shape):
            raise CheckpointError(
                f"{path}: {name} is {tuple(value.shape)}, the model has {tuple(mine[name].shape)}"
            )
    meta = header.meta
    try:
        state = _optimizer_state(tensors, meta.get("optim_scalars", {}))
        rng = tensors["rng/torch_cpu"]
        cuda_keys = sorted(
            (k for k in tensors if k.startswith("rng/cuda/")), key=lambda k: int(k.rsplit("/", 1)[1])
        )
        model.load_state_dict(model_state, strict=not adapter_names(model))
        # Keep this run's param groups (hyper-parameters come from the config; lr is set every step).
        optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})
        torch.set_rng_state(rng)
        cuda_states = [tensors[k] for k in cuda_keys]
        if cuda_states and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(cuda_states)
    except (KeyError, ValueError, TypeError, IndexError, RuntimeError, AttributeError) as exc:
        first = first_line(exc)
        raise CheckpointError(f"{path}: cannot restore its optimizer or RNG state ({first})") from None
    return Checkpoint(path, header.step, meta)


def _optimizer_state(tensors: Mapping[str, torch.Tensor], scalars: Any) -> dict[int, dict[str, Any]]:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith("optim/"):
            _, index, name = key.split("/", 2)
            state.setdefault(int(index), {})[name] = value
    if not isinstance(scalars, dict):
        raise ValueError("optim_scalars is not a mapping")
    for key, value in scalars.items():
        index, name = key.split("/", 1)
        state.setdefault(int(index), {})[name] = value
    return state
