"""The Hub's safetensors layout: ``model.safetensors``, or shards ``model-0000N-of-0000M.safetensors``
named by ``model.safetensors.index.json``. Read tensor by tensor through safetensors' memory map (a
checkpoint is never loaded whole); written shard by shard past a size."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from te_assembly.errors import CheckpointError
from te_assembly.files.read import LIMITS, read_json
from te_assembly.formats.tensor_file import as_checkpoint_error, open_safetensors, save_tensors

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


class HFCheckpoint(Mapping[str, torch.Tensor]):
    """A checkpoint's tensors by Hub name; ``shape(name)`` without reading it, ``[name]`` reads one
    tensor from its memory-mapped shard. Use as a context manager (the shards stay open inside)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.files = _shard_files(directory)
        self._stack = ExitStack()
        self._handles: dict[Path, Any] = {}
        self._where: dict[str, Path] = {}
        for file in sorted(set(self.files.values()) if self.files else []):
            if not file.exists() and not file.is_symlink():
                raise CheckpointError(f"{file} is missing: {INDEX} names it as a shard")
            try:
                handle = self._stack.enter_context(open_safetensors(file, within=directory))
            except CheckpointError:
                self._stack.close()
                raise
            self._handles[file] = handle
            for name in handle.keys():
                self._where[name] = file
        for name, file in self.files.items():
            if name and self._where.get(name) != file:
                raise CheckpointError(f"{INDEX} puts {name} in {file.name}, which does not hold it")

    def __enter__(self) -> HFCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def __getitem__(self, name: str) -> torch.Tensor:
        file = self._where[name]
        try:
            return self._handles[file].get_tensor(name)
        except Exception as exc:
            raise CheckpointError(
                f"{file}: tensor {name} cannot be read (corrupt or truncated): {exc}"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handles[self._where[name]].get_slice(name).get_shape())

    def dtype(self, name: str) -> str:
        """The tensor's dtype as safetensors names it (``F32``, ``BF16``, ``I32``...), without reading it."""
        return str(self._handles[self._where[name]].get_slice(name).get_dtype())


def _shard_files(directory: Path) -> dict[str, Path]:
    """Tensor name -> shard, from the index; ``{}`` with every name in ``model.safetensors``."""
    index = directory / INDEX
    if index.exists() or index.is_symlink():
        data = read_json(index, limit=LIMITS["index"], within=directory, make_error=as_checkpoint_error)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index} is not a shard index: it has no weight_map mapping")
        files = {}
        for name, file in weight_map.items():
            if not isinstance(file, str) or Path(file).name != file:
                raise CheckpointError(f"{index}: {name} is in {file!r}, which is not a file beside the index")
            files[name] = directory / file
        return files
    single = directory / SINGLE
    if not single.is_file() and not single.is_symlink():
        raise CheckpointError(f"{directory} has neither {SINGLE} nor {INDEX}: not a Hugging Face checkpoint")
    return {"": single}  # placeholder: every tensor of the one file


def write_shards(
    directory: Path, tensors: Iterable[tuple[str, torch.Tensor]], max_shard_bytes: int
) -> list[Path]:
    """Write ``tensors`` in the Hub's layout (one ``model.safetensors`` when they fit one shard).
    Tensors arrive one by one and each shard is written as soon as it is full."""

    shard: dict[str, torch.Tensor] = {}
    size = 0
    written: list[Path] = []
    weight_map: dict[str, int] = {}
    total = 0
    temp_names: list[Path] = []

    def flush() -> None:
        path = directory / f"shard-{len(temp_names) + 1}.tmp"
        save_tensors(shard, path, metadata={"format": "pt"})
        temp_names.append(path)

    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if shard and size + nbytes > max_shard_bytes:
            flush()
            shard, size = {}, 0  # the written shard's tensors are let go
        shard[name] = tensor.contiguous()
        weight_map[name] = len(temp_names) + 1
        size += nbytes
        total += nbytes
    flush()
    count = len(temp_names)
    if count == 1:
        final = directory / SINGLE
        temp_names[0].rename(final)
        return [final]
    for number, temp in enumerate(temp_names, start=1):
        final = directory / f"model-{number:05d}-of-{count:05d}.safetensors"
        temp.rename(final)
        written.append(final)
    index = {
        "metadata": {"total_size": total},
        "weight_map": {n: f"model-{k:05d}-of-{count:05d}.safetensors" for n, k in sorted(weight_map.items())},
    }
    (directory / INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return [*written, directory / INDEX]
