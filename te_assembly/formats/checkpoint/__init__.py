"""Training checkpoints: one home, one entry. ``save(par, ...)`` and ``load(par, ...)`` (``layouts.py``)
are what every run calls, one process or many: they pick the storage for the run's layout and keep the
manifest the same (the step, the run record and its hash, the layout and every rank's RNG state, a
checksum of everything stored). One process, and data, tensor or expert parallelism, store whole tensors
in one safetensors file (``file.py``: rank 0 writes what the ranks gathered); ``parallel.shard`` stores
DCP pieces in a directory with one safetensors file per rank (``sharded.py``). DCP reads either kind, so a
run reshards on resume. ``directory.py`` finds a run's checkpoints by their headers, the newest good one,
and prunes.
"""

from __future__ import annotations

from te_assembly.errors import CheckpointError
from te_assembly.formats.checkpoint.directory import (
    Found,
    list_checkpoints,
    newest_good,
    prune,
    remove_entry,
    remove_stale_temp,
    scan,
)
from te_assembly.formats.checkpoint.file import (
    FORMAT,
    SUFFIX,
    Checkpoint,
    Header,
    check_finite,
    checkpoint_path,
    free_checkpoint_path,
    load_checkpoint,
    model_state,
    name_step,
    read_header,
    read_meta,
    read_verified,
    save_checkpoint,
    verify,
    write_atomic,
    write_verified,
)
from te_assembly.formats.checkpoint.layouts import check_layout, layout_of, load, save

__all__ = [
    "FORMAT",
    "SUFFIX",
    "Checkpoint",
    "CheckpointError",
    "Found",
    "Header",
    "check_finite",
    "check_layout",
    "checkpoint_path",
    "free_checkpoint_path",
    "layout_of",
    "list_checkpoints",
    "load",
    "load_checkpoint",
    "model_state",
    "name_step",
    "newest_good",
    "prune",
    "read_header",
    "read_meta",
    "read_verified",
    "remove_entry",
    "remove_stale_temp",
    "save",
    "save_checkpoint",
    "scan",
    "verify",
    "write_atomic",
    "write_verified",
]
