"""Checkpoints in safetensors, written atomically: never a half-written file under a checkpoint name.

A checkpoint holds the model's state dict (``model/<name>``), the optimizer's tensor state
(``optim/<param index>/<key>``) and the RNG states (``rng/...``) as tensors; the step, the loss history,
the optimizer's non-tensor state and run facts go in the safetensors metadata as JSON (safetensors
stores tensors only, and metadata values must be strings).

Writes go to a temporary file in the same directory, are fsynced, then ``os.replace``d over the final
name (atomic on POSIX), and the directory is fsynced. A crash leaves either the old file set or the
new one, plus at most a ``.tmp`` file that is never read and is removed at the next start.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from te_assembly.errors import TeAssemblyError

FORMAT = "te_assembly.train/1"
_NAME = re.compile(r"^ckpt-(\d{7})\.safetensors$")
_TEMP_SUFFIX = ".tmp"


class CheckpointError(TeAssemblyError):
    """A checkpoint cannot be read, or does not fit the model being resumed."""


@dataclass
class Checkpoint:
    path: Path
    step: int
    meta: dict[str, Any]


def checkpoint_path(out_dir: Path, step: int) -> Path:
    return out_dir / f"ckpt-{step:07d}.safetensors"


def list_checkpoints(out_dir: Path) -> list[tuple[int, Path]]:
    """Finished checkpoints, oldest first (temporary files never match the name pattern)."""
    if not out_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in out_dir.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found)


def remove_stale_temp(out_dir: Path) -> list[Path]:
    """Delete temporary files a crashed write left behind."""
    if not out_dir.is_dir():
        return []
    stale = [p for p in out_dir.iterdir() if p.name.startswith(".") and p.name.endswith(_TEMP_SUFFIX)]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; not every platform can open a directory.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomic(path: Path, write: Callable[[str], object]) -> None:
    """Call ``write(temp_path)`` for a temp file next to ``path``, fsync it, then rename it over ``path``.
    On any failure the temp file is removed and ``path`` is left as it was."""
    tmp = ""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=_TEMP_SUFFIX)
        os.close(fd)
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if isinstance(exc, OSError):  # disk full, permissions...: a user problem, not a traceback
            raise CheckpointError(
                f"cannot write {path}: {exc.strerror or exc} (any previous file is intact)"
            ) from exc
        raise
    _fsync_dir(path.parent)


def write_text_atomic(path: Path, text: str) -> None:
    write_atomic(path, lambda tmp: Path(tmp).write_text(text))


def _rng_tensors() -> dict[str, torch.Tensor]:
    out = {"rng/torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            out[f"rng/cuda/{i}"] = state
    return out


def save_checkpoint(
    out_dir: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    meta: dict[str, Any],
) -> Path:
    """Write ``ckpt-<step>.safetensors`` atomically; ``meta`` must be JSON-serialisable."""
    tensors: dict[str, torch.Tensor] = {}
    for name, value in model.state_dict().items():
        tensors[f"model/{name}"] = value.detach().to("cpu").contiguous().clone()
    optim_scalars: dict[str, Any] = {}
    for index, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim/{index}/{key}"] = value.detach().to("cpu").contiguous().clone()
            else:
                optim_scalars[f"{index}/{key}"] = value
    tensors.update(_rng_tensors())
    full_meta = {**meta, "format": FORMAT, "step": step, "optim_scalars": optim_scalars}
    metadata = {"te_assembly": json.dumps(full_meta), "step": str(step)}
    path = checkpoint_path(out_dir, step)
    write_atomic(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))
    return path


def read_meta(path: Path) -> dict[str, Any]:
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get("te_assembly")
    except Exception as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from None
    if raw is None:
        raise CheckpointError(f"{path} is not a te_assembly training checkpoint (no metadata)")
    meta: dict[str, Any] = json.loads(raw)
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} has format {meta.get('format')!r}, expected {FORMAT!r}")
    return meta


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Checkpoint:
    """Restore model, optimizer and RNG states in place; return the step and metadata."""
    meta = read_meta(path)
    tensors = load_file(str(path), device="cpu")
    model_state = {k.removeprefix("model/"): v for k, v in tensors.items() if k.startswith("model/")}
    mine = model.state_dict()
    if set(model_state) != set(mine):
        missing, extra = sorted(set(mine) - set(model_state)), sorted(set(model_state) - set(mine))
        raise CheckpointError(f"{path} does not fit this model: missing {missing}, unexpected {extra}")
    for name, value in model_state.items():
        if tuple(value.shape) != tuple(mine[name].shape):
            raise CheckpointError(
                f"{path}: {name} has shape {tuple(value.shape)}, the model has {tuple(mine[name].shape)}"
            )
    model.load_state_dict(model_state)

    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith("optim/"):
            _, index, name = key.split("/", 2)
            state.setdefault(int(index), {})[name] = value
    for key, value in meta.get("optim_scalars", {}).items():
        index, name = key.split("/", 1)
        state.setdefault(int(index), {})[name] = value
    # Keep this run's param groups (hyper-parameters come from the config; lr is set every step).
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})

    torch.set_rng_state(tensors["rng/torch_cpu"])
    cuda_keys = sorted(
        (k for k in tensors if k.startswith("rng/cuda/")), key=lambda k: int(k.rsplit("/", 1)[1])
    )
    cuda_states = [tensors[k] for k in cuda_keys]
    if cuda_states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda_states)
    return Checkpoint(path, int(meta["step"]), meta)


def prune(out_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints."""
    found = list_checkpoints(out_dir)
    doomed = [p for _, p in found[: max(0, len(found) - keep)]]
    for p in doomed:
        p.unlink(missing_ok=True)
    return doomed
