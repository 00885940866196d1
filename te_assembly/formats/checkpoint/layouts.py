"""Checkpoints of parallel runs: gathered to global tensors, written once by rank 0, read by every rank.

A parallel run's checkpoint is a single-process checkpoint (``checkpoint.py``: same keys, shapes
and format, atomic write) plus, in its metadata, the layout that wrote it and every rank's RNG state.
Every rank takes part in the gather; rank 0 alone writes; the others wait for it.

Resuming: with the same layout everything is restored exactly, each rank's RNG state included. Only
``parallel.data`` (the state is the same on every data-parallel replica; the RNG streams then restart
from rank 0's) and ``parallel.shard`` (DCP reshards: ``sharded.py``) may change. A change of
``tensor``, ``sequence`` or ``expert`` is refused: it would change how every weight is cut and in which
order each sum is taken mid-run.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from te_assembly.analysis.parallel.layout import REPLICATED, ParamShard
from te_assembly.engines.parallel.context import ParallelContext
from te_assembly.engines.parallel.sharding import take_slice
from te_assembly.formats.checkpoint import sharded
from te_assembly.formats.checkpoint.file import (
    Checkpoint,
    CheckpointError,
    load_checkpoint,
    read_meta,
    save_checkpoint,
    verify,
)
from te_assembly.formats.checkpoint.state import adapter_names

SINGLE = {"data": 1, "shard": 1, "tensor": 1, "sequence": 1, "expert": 1}
RESHARDABLE = ("data", "shard")


class _Frozen:
    """A ``state_dict()`` that returns what it was given (rank 0's gathered global state)."""

    def __init__(self, state: dict[str, Any]) -> None:
        self._state = state

    def state_dict(self) -> dict[str, Any]:
        return self._state


def _trainable(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The optimizer's parameter list, in its order (``train.optim.make_optimizer``)."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def _global_state(par: ParallelContext, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    named = {par.local_to_global.get(k, k): v for k, v in model.state_dict().items()}
    keep = adapter_names(model)
    return par.gather_global({k: v for k, v in named.items() if k in keep} if keep else named)


def _global_optimizer_state(
    par: ParallelContext, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> dict[int, dict[str, Any]] | None:
    """The optimizer's per-parameter state keyed by the global parameter index (a single process's)."""
    params = _trainable(model)
    state = optimizer.state_dict()["state"]
    by_key: dict[str, dict[str, torch.Tensor]] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, entry in state.items():
        key = par.local_to_global[params[index][0]]
        for slot, value in entry.items():
            if isinstance(value, torch.Tensor):
                by_key.setdefault(slot, {})[key] = value
            else:
                scalars.setdefault(key, {})[slot] = value
    out: dict[str, dict[str, Any]] = {}
    for slot in sorted(by_key):  # the same order on every rank: gather_global is a collective
        tensors = by_key[slot]
        rules = {k: _state_rule(par, k, v, dict(params)) for k, v in tensors.items()}
        gathered = par.gather_global(tensors, rules)
        for key, value in (gathered or {}).items():
            out.setdefault(key, {})[slot] = value
    if not par.is_main:
        return None
    for key, entry in scalars.items():
        out.setdefault(key, {}).update(entry)
    order = par.optimizer_index(model)
    return {order[key]: entry for key, entry in out.items()}


def _state_rule(
    par: ParallelContext, key: str, value: torch.Tensor, params: Mapping[str, torch.nn.Parameter]
) -> ParamShard:
    """An optimizer state tensor shaped like its parameter is cut like it; a scalar (Adam's step) is not."""
    local = next(n for n, k in par.local_to_global.items() if k == key)
    return par.global_rules[key] if tuple(value.shape) == tuple(params[local].shape) else REPLICATED


def save(
    par: ParallelContext | None,
    out_dir: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    meta: dict[str, Any],
) -> Path | None:
    """Every rank calls this; rank 0 writes ``ckpt-<step>`` atomically and returns its path, the others
    None once it is written. A sharded run (``parallel.shard``) writes a DCP directory
    (``sharded.py``) instead, every rank its own pieces."""
    if par is None or not par.is_parallel:
        return save_checkpoint(out_dir, step, model, optimizer, meta)
    if par.is_sharded:
        return sharded.save(par, out_dir, step, model, optimizer, meta)
    state = _global_state(par, model)
    optim_state = _global_optimizer_state(par, model, optimizer)
    rng = sharded.rng_states(par)
    path = None
    if par.is_main:
        assert state is not None and optim_state is not None
        layout = {**par.settings.sizes(), "rng": rng}
        frozen_optim = _Frozen({"state": optim_state})
        path = save_checkpoint(out_dir, step, _Frozen(state), frozen_optim, {**meta, "parallel": layout})  # type: ignore[arg-type]
    par.barrier()
    return path


def layout_of(meta: Mapping[str, Any]) -> dict[str, int]:
    recorded = meta.get("parallel")
    if not isinstance(recorded, Mapping):
        return dict(SINGLE)
    return {k: int(recorded.get(k, 1)) for k in SINGLE}


def check_layout(path: Path, meta: Mapping[str, Any], par: ParallelContext | None) -> str | None:
    """Refuse a resume whose layout cuts the weights differently; a note when only ``data`` changed."""
    recorded, now = layout_of(meta), (par.settings.sizes() if par is not None else dict(SINGLE))
    if recorded == now:
        return None
    changed = [k for k in SINGLE if recorded[k] != now[k]]
    shown = ", ".join(f"parallel.{k}: checkpoint {recorded[k]}, now {now[k]}" for k in changed)
    if any(k not in RESHARDABLE for k in changed) or ("shard" in changed and now["tensor"] > 1):
        sizes = (
            " ".join(f"parallel.{k}={recorded[k]}" for k in SINGLE if recorded[k] != 1) or "no parallel sizes"
        )
        world = recorded["data"] * recorded["shard"] * recorded["tensor"] * recorded["expert"]
        raise CheckpointError(
            f"cannot resume from {path} with another parallel layout ({shown}): only parallel.data and "
            "parallel.shard may change on resume (the checkpoint holds whole tensors, or DCP pieces it "
            "reshards); tensor, sequence and expert sizes cut the weights by hand and fix the order of "
            f"every sum. Resume with {sizes} (torchrun --nproc_per_node={world} for one machine), or start "
            "over in another train.out_dir"
        )
    if "shard" in changed:
        return (
            f"resumed with another FSDP2 layout ({shown}): DCP resharded the state; RNG streams start afresh"
        )
    return f"resumed with another data-parallel size ({shown}): RNG streams restart from rank 0's"


class _GlobalView:
    """What ``load_checkpoint`` sees of a rank's model: global keys and shapes; loading takes this
    rank's slices."""

    def __init__(self, par: ParallelContext, model: torch.nn.Module) -> None:
        self.par, self.model = par, model

    def state_dict(self) -> dict[str, torch.Tensor]:
        shapes = {key: torch.empty(shape, device="meta") for key, shape in self.par.global_shapes.items()}
        for key, value in self.model.state_dict().items():
            if key not in self.par.local_to_global:
                shapes[key] = value  # not a parameter (a buffer, TE's extra state): the same everywhere
        keep = adapter_names(self.model)
        return {k: v for k, v in shapes.items() if k in keep} if keep else shapes

    def load_state_dict(self, state: Mapping[str, torch.Tensor], strict: bool = True) -> None:
        self.par.load_global(self.model, state, strict=strict)
        others = {k: v for k, v in state.items() if k not in self.par.global_rules}
        if others:
            self.model.load_state_dict(others, strict=False)


class _LocalOptimizer:
    """What ``load_checkpoint`` sees of a rank's optimizer: it loads this rank's slices of the state."""

    def __init__(
        self, par: ParallelContext, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> None:
        self.par, self.model, self.optimizer = par, model, optimizer

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        par, mesh = self.par, self.par.mesh
        assert mesh is not None
        order = par.optimizer_index(self.model)
        local: dict[int, dict[str, Any]] = {}
        for index, (name, param) in enumerate(_trainable(self.model)):
            key = par.local_to_global[name]
            entry = state["state"].get(order[key])
            if entry is None:
                continue
            rule = par.global_rules[key]
            local[index] = {
                slot: _local_slice(value, rule, param, par) if isinstance(value, torch.Tensor) else value
                for slot, value in entry.items()
            }
        self.optimizer.load_state_dict(
            {"state": local, "param_groups": self.optimizer.state_dict()["param_groups"]}
        )


def _local_slice(
    value: torch.Tensor, rule: ParamShard, param: torch.Tensor, par: ParallelContext
) -> torch.Tensor:
    mesh = par.mesh
    assert mesh is not None
    if rule.kind == "tensor" and value.dim() > rule.dim:
        value = take_slice(value, rule, mesh.tensor_rank, par.settings.tensor)
    if tuple(value.shape) not in (tuple(param.shape), ()):
        raise CheckpointError(
            f"optimizer state of shape {tuple(value.shape)} does not fit {tuple(param.shape)}"
        )
    return value


def load(
    par: ParallelContext | None, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[Checkpoint, str | None]:
    """Every rank restores its slices of model and optimizer state, and its own RNG state when the layout
    is the one that wrote the checkpoint (``par`` None: one process). Returns the checkpoint and a note
    for the user, if any."""
    meta = read_meta(path)
    note = check_layout(path, meta, par)
    is_dcp = sharded.is_sharded_checkpoint(path)
    if (par is None or not par.is_parallel) and not is_dcp:
        return load_checkpoint(path, model, optimizer), note
    if par is None:  # a sharded checkpoint into one process: DCP gathers it
        par = ParallelContext.single(model.plan)  # type: ignore[arg-type]
    if par.is_sharded or is_dcp:
        return _load_resharded(par, path, meta, model, optimizer), note
    ckpt = load_checkpoint(path, _GlobalView(par, model), _LocalOptimizer(par, model, optimizer))  # type: ignore[arg-type]
    states = (meta.get("parallel") or {}).get("rng")
    if note is None and isinstance(states, list) and len(states) == par.settings.world_size:
        raw = base64.b64decode(states[par.rank])
        torch.set_rng_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
    return ckpt, note


def _load_resharded(
    par: ParallelContext,
    path: Path,
    meta: Mapping[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
) -> Checkpoint:
    """Through DCP: a sharded checkpoint on any layout without tensor or expert cuts, or a
    single-process checkpoint onto a sharded run (``meta``: its header's). Rank 0 verifies every
    checksum first."""
    problem = None
    if par.is_main:
        try:
            verify(path)
        except CheckpointError as exc:
            problem = str(exc)
    problem = par.from_main(problem)
    if problem is not None:
        raise CheckpointError(problem)
    sharded.load_into(par, path, model, optimizer)
    if sharded.is_sharded_checkpoint(path):
        sharded.restore_rng(meta, par)
    return Checkpoint(path, int(meta["step"]), dict(meta))


__all__ = ["check_layout", "layout_of", "load", "save"]
