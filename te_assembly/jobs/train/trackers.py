"""Where a run's per-step scalars go besides ``metrics.jsonl``: TensorBoard, Weights & Biases and MLflow
(``train.loggers``), each an optional extra, each behind one small interface (``log`` a step's scalars,
``close``), so ``metrics.py`` writes one record to all of them.

Every tracker keeps to the run directory unless its own environment says otherwise: TensorBoard's
events in ``tensorboard/``; W&B's run in ``wandb/`` (``WANDB_MODE=offline`` writes there alone,
``wandb sync`` uploads it later; ``WANDB_PROJECT`` names the project, ``te_assembly`` by default); MLflow's
in ``mlflow.db`` (SQLite: MLflow 3 keeps its plain-file store in maintenance) unless
``MLFLOW_TRACKING_URI`` names a server or another store (``MLFLOW_EXPERIMENT_NAME``: the experiment,
``te_assembly`` by default). A resumed run continues the same W&B and MLflow run: their ids are kept in
``trackers.json`` beside the checkpoints.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from te_assembly.errors import ArgumentError, MissingToolError
from te_assembly.files.read import LIMITS, InputFileError, read_json
from te_assembly.files.write import write_text_atomic

IDS_FILE = "trackers.json"
TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"
"""Where W&B keeps its runs under the directory it is given."""
MLFLOW_STORE = "mlflow.db"
PROJECT = "te_assembly"


class TrackerError(MissingToolError):
    """A tracker cannot start (W&B not logged in, an MLflow server out of reach); the message says what
    to do."""


class Tracker(Protocol):
    def log(self, step: int, scalars: Mapping[str, float], wall_time: float | None) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class RunInfo:
    """What a tracker is told of the run it records."""

    out_dir: Path
    start_step: int
    """The step the run resumes after (0: a fresh run)."""
    name: str
    params: Mapping[str, Any]
    """The resolved config, nested (W&B's config; MLflow's params, flattened)."""


@dataclass(frozen=True)
class Kind:
    module: str
    """The package it needs (``importlib.util.find_spec``)."""
    extra: str
    opens: Callable[[RunInfo], Tracker]

    @property
    def installed(self) -> bool:
        try:
            return importlib.util.find_spec(self.module) is not None
        except (ImportError, ValueError):
            return False


def resolve(names: Sequence[str] | None) -> tuple[str, ...]:
    """The trackers a run writes to: ``names`` (each installed, or ``MissingToolError`` saying how to
    install it), or with None TensorBoard where it is installed."""
    if names is None:
        return ("tensorboard",) if KINDS["tensorboard"].installed else ()
    unknown = [n for n in names if n not in KINDS]
    if unknown:
        raise ArgumentError(f"train.loggers: {', '.join(map(repr, unknown))}: choose from {', '.join(KINDS)}")
    missing = [n for n in dict.fromkeys(names) if not KINDS[n].installed]
    if missing:
        extras = ",".join(KINDS[n].extra for n in missing)
        raise MissingToolError(
            f"train.loggers names {', '.join(missing)}, not installed: pip install 'te_assembly[{extras}]' "
            "(or leave it out of train.loggers)"
        )
    return tuple(dict.fromkeys(names))


def open_all(names: Sequence[str], run: RunInfo) -> list[Tracker]:
    """Each of ``names`` opened for ``run`` (those opened so far are closed if one cannot start)."""
    opened: list[Tracker] = []
    try:
        for name in names:
            opened.append(KINDS[name].opens(run))
    except BaseException:
        for tracker in opened:
            with contextlib.suppress(Exception):
                tracker.close()
        raise
    return opened


def _ids(out_dir: Path) -> dict[str, Any]:
    """The W&B and MLflow run ids a run directory keeps (none where it keeps none)."""
    path = out_dir / IDS_FILE
    if not path.exists():
        return {}
    with contextlib.suppress(InputFileError):
        data = read_json(path, limit=LIMITS["metadata"], within=out_dir)
        if isinstance(data, dict):
            return data
    return {}


def _keep_id(run: RunInfo, name: str, value: str) -> None:
    ids = {**_ids(run.out_dir), name: value}
    write_text_atomic(run.out_dir / IDS_FILE, json.dumps(ids, indent=2) + "\n")


def _resumed_id(run: RunInfo, name: str) -> str | None:
    """The id this tracker's run had in ``run.out_dir``, when this run resumes it."""
    value = _ids(run.out_dir).get(name) if run.start_step else None
    return value if isinstance(value, str) and value else None


class TensorBoard:
    def __init__(self, run: RunInfo) -> None:
        from torch.utils.tensorboard import SummaryWriter

        log_dir = run.out_dir / TENSORBOARD_DIR
        if not run.start_step and log_dir.is_dir():  # a run without checkpoints left these: started over
            for events in log_dir.glob("events.out.tfevents.*"):
                with contextlib.suppress(OSError):
                    events.unlink()
        purge = {"purge_step": run.start_step + 1} if run.start_step else {}
        self.writer = SummaryWriter(log_dir=str(log_dir), **purge)

    def log(self, step: int, scalars: Mapping[str, float], wall_time: float | None) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step, walltime=wall_time)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandB:
    """One W&B run per run directory; a resumed run continues it (steps it redoes are W&B's to drop:
    it keeps a step's first value)."""

    def __init__(self, run: RunInfo) -> None:
        import wandb

        resumed = _resumed_id(run, "wandb")
        run_id = resumed or uuid.uuid4().hex[:12]
        try:
            self.run = wandb.init(
                project=os.environ.get("WANDB_PROJECT") or PROJECT,
                name=run.name,
                id=run_id,
                resume="allow" if resumed else None,
                dir=str(run.out_dir),
                config=dict(run.params),
                reinit="create_new",
                settings=wandb.Settings(silent=True),  # its banner and summary: te_assembly says where
            )
        except Exception as exc:  # wandb raises its own UsageError, CommError... for a run that cannot start
            raise TrackerError(
                f"Weights & Biases could not start a run: {exc} (wandb login, or WANDB_MODE=offline to "
                "keep the run in the run directory for wandb sync)"
            ) from None
        _keep_id(run, "wandb", run_id)

    def log(self, step: int, scalars: Mapping[str, float], wall_time: float | None) -> None:
        self.run.log(dict(scalars), step=step)

    def close(self) -> None:
        self.run.finish()


def _flat(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{name}."))
        elif not isinstance(value, list) or len(str(value)) < 500:
            out[name] = str(value)[:6000]  # MLflow's limit on a param's value
    return out


class MLflow:
    """One MLflow run per run directory, in ``mlflow.db`` there unless ``MLFLOW_TRACKING_URI`` says
    otherwise; a resumed run continues it (its redone steps are logged again, as MLflow keeps every
    value of a step)."""

    def __init__(self, run: RunInfo) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        # its INFO lines (creating the database's tables...) would interleave with te_assembly's own;
        # importing it sets its level, so this comes after
        logging.getLogger("mlflow").setLevel(logging.WARNING)
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(run.out_dir / MLFLOW_STORE).resolve()}"
        try:
            self.client = MlflowClient(tracking_uri=uri)
            self.run_id = _resumed_id(run, "mlflow") or self._new_run(run)
            if not run.start_step:
                params = [Param(k, v) for k, v in _flat(run.params).items()]
                for start in range(0, len(params), 100):  # MLflow takes 100 params a call
                    self.client.log_batch(self.run_id, params=params[start : start + 100])
        except Exception as exc:  # a store that cannot be opened or written
            raise TrackerError(f"MLflow could not record the run at {uri}: {exc}") from None
        _keep_id(run, "mlflow", self.run_id)

    def _new_run(self, run: RunInfo) -> str:
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or PROJECT
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        return str(self.client.create_run(experiment_id, run_name=run.name).info.run_id)

    def log(self, step: int, scalars: Mapping[str, float], wall_time: float | None) -> None:
        from mlflow.entities import Metric

        stamp = int((wall_time if wall_time is not None else time.time()) * 1000)
        metrics = [Metric(_metric_name(key), float(value), stamp, step) for key, value in scalars.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _metric_name(tag: str) -> str:
    """``tag`` in the characters MLflow allows in a metric's name (``loss/mse(y, teacher)`` ->
    ``loss/mse_y_ teacher_``)."""
    return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", tag)


KINDS: dict[str, Kind] = {
    "tensorboard": Kind("tensorboard", "tensorboard", TensorBoard),
    "wandb": Kind("wandb", "wandb", WandB),
    "mlflow": Kind("mlflow", "mlflow", MLflow),
}
"""Every tracker ``train.loggers`` may name: the package it needs and the extra that installs it."""

__all__ = [
    "IDS_FILE",
    "KINDS",
    "MLFLOW_STORE",
    "TENSORBOARD_DIR",
    "WANDB_DIR",
    "RunInfo",
    "Tracker",
    "TrackerError",
    "open_all",
    "resolve",
]
