"""Per-step training metrics: ``metrics.jsonl`` (one JSON object per line) and, when the ``tensorboard``
package is installed, TensorBoard event files under ``tensorboard/``.

Each record: ``step``, ``loss``, ``terms`` (every loss term by name: the regression error and each
aux loss), ``lr``, ``grad_norm`` (the whole model's gradient, before the optimizer step), ``tokens_per_s``,
``step_time_s`` (forward + backward + optimizer step), ``wall_time`` (seconds since the epoch, when the
step ended) and ``elapsed_s`` (since this invocation started training); a language model's records on the
steps it is evaluated (``train.eval_every``, and the last) also hold ``val_loss`` (nats per token),
``val_perplexity`` and ``val_bits_per_byte`` (None for pre-tokenized data, whose bytes are unknown).

Written as the run goes, one line per step, flushed: a crash keeps every step before it. A resumed run
first drops the lines after the checkpoint it resumes from (the steps it is about to redo), so each step
appears once; TensorBoard is told the same (``purge_step``). A run started with ``train.overwrite=true``
holds its records until its first checkpoint replaces the earlier run (whose files stay whole until
then, ``run_dir.py``).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from te_assembly.errors import MissingToolError
from te_assembly.files.file_types import check_regular
from te_assembly.files.write import write_error, write_text_atomic

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
INSTALL_HINT = "pip install 'te_assembly[tensorboard]'"


def tensorboard_writer_class() -> Any:
    """``torch.utils.tensorboard.SummaryWriter``, or None when the ``tensorboard`` package is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter


def check_tensorboard(wanted: bool | None) -> bool:
    """Whether to write TensorBoard events: ``None`` when installed, ``True`` or ``MissingToolError``,
    ``False`` never."""
    if wanted is False:
        return False
    if tensorboard_writer_class() is not None:
        return True
    if wanted:
        raise MissingToolError(
            f"train.tensorboard=true, but the tensorboard package is not installed: {INSTALL_HINT} (or "
            "train.tensorboard=null to write TensorBoard events only where it is installed)"
        )
    return False


def read_records(path: Path) -> list[dict[str, Any]]:
    """The readable records of a metrics file, in order; a torn last line (a crash mid-write) and any
    line that is not a record are skipped."""
    records = []
    check_regular(path, "metrics file")
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and isinstance(record.get("step"), int):
                    records.append(record)
    return records


def _json_number(value: float) -> float | str:
    """JSON has no NaN/Infinity: those are written as strings ("nan", "inf")."""
    return value if math.isfinite(value) else str(value)


def _clean(record: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, float):
            out[key] = _json_number(value)
        elif isinstance(value, Mapping):
            out[key] = _clean(value)
        else:
            out[key] = value
    return out


class MetricsLog:
    """``metrics.jsonl`` (and TensorBoard) of one run directory; only the process that writes the run's
    files (rank 0) opens one."""

    def __init__(self, out_dir: Path, *, start_step: int, tensorboard: bool, hold: bool = False) -> None:
        self.path = out_dir / METRICS_FILE
        self.tensorboard_dir = out_dir / TENSORBOARD_DIR
        self.start_step = start_step
        self.use_tensorboard = tensorboard
        self._held: list[dict[str, Any]] | None = [] if hold else None
        self._file: Any = None
        self._writer: Any = None
        if not hold:
            self._open()

    def _open(self) -> None:
        """Keep the records up to ``start_step`` (none for a fresh run), then append."""
        kept = [r for r in read_records(self.path) if r["step"] <= self.start_step] if self.start_step else []
        text = "".join(json.dumps(r) + "\n" for r in kept)
        write_text_atomic(self.path, text)
        if not self.start_step:
            self._clear_tensorboard()  # a run without checkpoints left these: it is being started over
        try:
            check_regular(self.path, "metrics file")
            self._file = open(self.path, "a", encoding="utf-8")  # held open for the run
        except OSError as exc:
            raise write_error(self.path, exc) from None
        if self.use_tensorboard:
            writer = tensorboard_writer_class()
            purge = {"purge_step": self.start_step + 1} if self.start_step else {}
            self._writer = writer(log_dir=str(self.tensorboard_dir), **purge)

    def _clear_tensorboard(self) -> None:
        if self.tensorboard_dir.is_dir():
            for events in self.tensorboard_dir.glob("events.out.tfevents.*"):
                with contextlib.suppress(OSError):
                    events.unlink()

    def commit(self) -> None:
        """Start writing (after ``train.overwrite=true``'s first checkpoint): the held records first."""
        if self._held is None:
            return
        held, self._held = self._held, None
        self._open()
        for record in held:
            self._write(record)

    def record(self, record: Mapping[str, Any]) -> None:
        if self._held is not None:
            self._held.append(dict(record))
        else:
            self._write(record)

    def _write(self, record: Mapping[str, Any]) -> None:
        try:
            self._file.write(json.dumps(_clean(record)) + "\n")
            self._file.flush()
        except OSError as exc:
            raise write_error(self.path, exc) from None
        if self._writer is not None:
            step = int(record["step"])
            for tag, value in _scalars(record):
                self._writer.add_scalar(tag, value, step, walltime=record.get("wall_time"))
            self._writer.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _scalars(record: Mapping[str, Any]) -> Iterator[tuple[str, float]]:
    """TensorBoard tags: ``loss``, ``loss/<term>``, ``lr``, ``grad_norm``, ``tokens_per_s``..."""
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "step_time_s"):
        value = record.get(key)
        if isinstance(value, (int, float)):
            yield key, float(value)
    for key in ("val_loss", "val_perplexity", "val_bits_per_byte"):
        value = record.get(key)
        if isinstance(value, (int, float)):
            yield key.replace("val_", "validation/"), float(value)
    for name, value in (record.get("terms") or {}).items():
        if isinstance(value, (int, float)):
            yield f"loss/{name}", float(value)


__all__ = [
    "INSTALL_HINT",
    "METRICS_FILE",
    "TENSORBOARD_DIR",
    "MetricsLog",
    "check_tensorboard",
    "read_records",
    "tensorboard_writer_class",
]
