"""Per-step training metrics: ``metrics.jsonl`` (one JSON object per line) and the trackers of
``train.loggers`` (``trackers.py``: TensorBoard where it is installed by default; W&B, MLflow).

Each record: ``step``, ``loss``, ``terms`` (every loss term by name: the regression error and each
aux loss), ``lr``, ``grad_norm`` (the whole model's gradient, before the optimizer step), ``tokens_per_s``,
``step_time_s`` (forward + backward + optimizer step), ``wall_time`` (seconds since the epoch, when the
step ended) and ``elapsed_s`` (since this invocation started training); a language model's records on the
steps it is evaluated (``train.eval_every``, and the last) also hold ``val_loss`` (nats per token),
``val_perplexity`` and ``val_bits_per_byte`` (None for pre-tokenized data, whose bytes are unknown).

Written as the run goes, one line per step, flushed: a crash keeps every step before it. A resumed run
first drops the lines after the checkpoint it resumes from (the steps it is about to redo), so each step
appears once; TensorBoard is told the same (``purge_step``), W&B and MLflow continue their run. A run
started with ``train.overwrite=true`` holds its records until its first checkpoint replaces the earlier
run (whose files stay whole until then, ``run_dir.py``).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from te_assembly.files.file_types import check_regular
from te_assembly.files.write import write_error, write_text_atomic
from te_assembly.jobs.train.trackers import RunInfo, Tracker, open_all

METRICS_FILE = "metrics.jsonl"


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
    """``metrics.jsonl`` (and the trackers) of one run directory; only the process that writes the run's
    files (rank 0) opens one. ``trackers``: names of ``trackers.KINDS``, resolved (``trackers.resolve``)."""

    def __init__(
        self,
        out_dir: Path,
        *,
        start_step: int,
        trackers: Sequence[str] = (),
        hold: bool = False,
        name: str = "",
        params: Mapping[str, Any] | None = None,
    ) -> None:
        self.path = out_dir / METRICS_FILE
        self.run = RunInfo(out_dir, start_step, name or out_dir.name, dict(params or {}))
        self.start_step = start_step
        self.tracker_names = tuple(trackers)
        self._held: list[dict[str, Any]] | None = [] if hold else None
        self._file: Any = None
        self._trackers: list[Tracker] = []
        if not hold:
            self._open()

    def _open(self) -> None:
        """Keep the records up to ``start_step`` (none for a fresh run), then append."""
        kept = [r for r in read_records(self.path) if r["step"] <= self.start_step] if self.start_step else []
        text = "".join(json.dumps(r) + "\n" for r in kept)
        write_text_atomic(self.path, text)
        try:
            check_regular(self.path, "metrics file")
            self._file = open(self.path, "a", encoding="utf-8")  # held open for the run
        except OSError as exc:
            raise write_error(self.path, exc) from None
        self._trackers = open_all(self.tracker_names, self.run)

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
        scalars = dict(_scalars(record))
        for tracker in self._trackers:
            tracker.log(int(record["step"]), scalars, record.get("wall_time"))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        trackers, self._trackers = self._trackers, []
        for tracker in trackers:
            tracker.close()


def _scalars(record: Mapping[str, Any]) -> Iterator[tuple[str, float]]:
    """The trackers' tags: ``loss``, ``loss/<term>``, ``lr``, ``grad_norm``, ``tokens_per_s``,
    ``validation/loss``..."""
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
    for name, value in (record.get("measures") or {}).items():
        if isinstance(value, (int, float)):
            yield name, float(value)


__all__ = ["METRICS_FILE", "MetricsLog", "read_records"]
