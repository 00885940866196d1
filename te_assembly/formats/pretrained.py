"""Weights that load anywhere: a directory with ``model.safetensors`` and ``config.yaml``.

``save_pretrained(model, dir)`` writes the model's weights under their plain parameter names
(``steps.<step>.<TE parameter name>``, the same in every engine; TE's ``_extra_state`` quantization
metadata is not a weight and stays out) and the fully resolved model (every step with its arguments,
defaults filled in, and its channel bindings), the recipe it was built with and the weights' dtype.
``from_pretrained(dir, target)`` builds that model in any engine and loads the weights.
``export_checkpoint`` (the ``export`` command) does the same from a training checkpoint: its model
tensors (global tensors, whatever parallel layout trained it) and its run record.

``model.safetensors`` is a plain safetensors file (``safetensors.torch.load_file`` reads it; its header
says ``format: pt``) that also carries every tensor's SHA-256 and the SHA-256 of ``config.yaml``, checked
by ``from_pretrained`` before any weight is used (directories written before the config's checksum was
recorded load without that check). Non-finite weights are never written or loaded. The directory is
written as a whole: both files go into a hidden directory beside it (each fsynced; the weights read
back and verified), which then takes its place, so a save killed at any point leaves the old pretrained
directory as it was and loadable. A directory that already holds files is refused unless ``overwrite``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml

from te_assembly.analysis.plan import Plan
from te_assembly.data.tokenizer import text_fingerprint
from te_assembly.engines.target import Target, for_source
from te_assembly.errors import ArgumentError, ConfigError, NonFiniteError
from te_assembly.files.directory import PRETRAINED, check_destination, recover, write_directory
from te_assembly.files.ownership import run_evidence
from te_assembly.files.read import LIMITS, InputFileError, read_text
from te_assembly.files.write import write_text_atomic
from te_assembly.formats.checkpoint import (
    CheckpointError,
    model_state,
    read_meta,
    read_verified,
    write_verified,
)
from te_assembly.formats.companions import TOKENIZER_FILE, read_companions
from te_assembly.formats.model_record import model_record

if TYPE_CHECKING:
    from te_assembly.engines.base import AssembledModel

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.yaml"
FORMAT = "te_assembly.pretrained/1"
_EXTRA_STATE = "._extra_state"
_STAGING = ".saving"
"""Suffix of the hidden directory a save writes into before it takes the pretrained directory's place."""


def expected_shapes(plan: Plan) -> dict[str, tuple[int, ...]]:
    """Every weight of ``plan`` by its plain name, at its full (single-process) shape."""
    tied = plan.tied_params  # stored once, under the name of the weight they are tied to
    shapes = {
        f"steps.{step.name}.{name}": tuple(shape)
        for step in plan.steps
        for name, shape in step.param_shapes.items()
    }
    return {name: shape for name, shape in shapes.items() if name not in tied}


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        name: value.detach().to("cpu").contiguous().clone()
        for name, value in model.state_dict().items()
        if isinstance(value, torch.Tensor) and not name.endswith(_EXTRA_STATE)
    }


def _check_fits(plan: Plan, weights: Mapping[str, torch.Tensor], where: str) -> None:
    """``CheckpointError`` naming every weight that is missing, unexpected or of another shape."""
    wanted = expected_shapes(plan)
    if plan.adapter_params and not plan.adapter_params & set(weights):
        wanted = {k: v for k, v in wanted.items() if k not in plan.adapter_params}  # a base, adapters fresh
    missing = sorted(set(wanted) - set(weights))
    extra = sorted(set(weights) - set(wanted))
    shapes = [
        f"{k}: {tuple(weights[k].shape)}, the model has {wanted[k]}"
        for k in sorted(set(wanted) & set(weights))
        if tuple(weights[k].shape) != wanted[k]
    ]
    # An integer or bool tensor would load as floats of its values (ids as weights of about 1e9).
    shapes += [
        f"{k} holds {str(weights[k].dtype).removeprefix('torch.')} values, not floating-point weights"
        for k in sorted(set(wanted) & set(weights))
        if not weights[k].is_floating_point()
    ]
    if missing or extra or shapes:
        parts = [f"missing {missing}" if missing else "", f"unexpected {extra}" if extra else ""]
        parts += shapes
        raise CheckpointError(
            f"{where} does not fit the model {plan.name}: {'; '.join(p for p in parts if p)}"
        )


def config_of(
    model_config: Mapping[str, Any],
    recipe: Mapping[str, Any] | None,
    dtype: str,
    tied: Mapping[str, str] | None = None,
    tokenizer: str | None = None,
) -> dict[str, Any]:
    """The content of a pretrained directory's ``config.yaml``: what ``te_assembly.load`` takes back,
    (``tied_weights``) each tied weight with the one it is stored as, and (``tokenizer``) the
    fingerprint of the tokenizer the model was trained with (``data.tokenizer``), which ``generate``
    and ``train.init_from`` hold every other tokenizer to."""
    config = {
        "format": FORMAT,
        "model": dict(model_config),
        "recipe": dict(recipe) if recipe else None,
        "dtype": dtype,
    }
    if tied:
        config["tied_weights"] = dict(tied)
    if tokenizer is not None:
        config["tokenizer"] = tokenizer
    return config


def write_pretrained(
    directory: str | os.PathLike[str],
    weights: Mapping[str, torch.Tensor],
    config: Mapping[str, Any],
    *,
    overwrite: bool = False,
    files: Mapping[str, str] | None = None,
    sources: Sequence[str | os.PathLike[str]] = (),
) -> Path:
    """Write ``model.safetensors`` and ``config.yaml`` into ``directory`` through the guarded directory
    writer (``files.directory``: whole or not at all, never over a source, a run or files te_assembly
    did not write), with ``files`` (relative path -> text: the model's companions, an imported model's
    YAML). ``sources``: what the weights were read from."""
    check_finite(weights, "the weights")

    def fill(staging: Path) -> None:
        _write_files(staging, weights, config)
        for relative, text in (files or {}).items():
            target = staging / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")

    return write_directory(directory, PRETRAINED, fill, overwrite=overwrite, sources=sources)


def _write_files(out: Path, weights: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> None:
    header = (
        '# te_assembly pretrained model: te_assembly.from_pretrained(<this directory>, "reference" or "te")\n'
        "# the model as built (each step, its arguments with defaults, its channels), its recipe, its dtype\n"
    )
    body = yaml.safe_dump(dict(config), sort_keys=False, allow_unicode=True, default_flow_style=False)
    text = header + body
    # The weights file records the config's checksum, so an edited or corrupt config.yaml is refused too.
    meta = {"model": config["model"].get("name"), "config_sha256": _sha256(text.encode())}
    if config.get("tied_weights"):
        meta["tied_weights"] = dict(config["tied_weights"])
    write_verified(out / WEIGHTS_FILE, weights, meta, FORMAT, {"format": "pt"})
    write_text_atomic(out / CONFIG_FILE, text)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def weights_dtype(weights: Mapping[str, torch.Tensor]) -> str:
    """The dtype a model's weights are saved in, by name (``float32`` with no float tensor)."""
    floats = [w.dtype for w in weights.values() if w.is_floating_point()]
    return str(floats[0] if floats else torch.float32).removeprefix("torch.")


def check_finite(weights: Mapping[str, torch.Tensor], where: str) -> None:
    """``NonFiniteError`` naming the first weight with a NaN or an infinity: such weights are never saved
    or loaded (as training never checkpoints them)."""
    for name, value in weights.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise NonFiniteError(0, name, f"non-finite value in {name} of {where}: refusing to use it")


def save_pretrained(
    model: AssembledModel,
    directory: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    recipe: Mapping[str, Any] | None = None,
    tokenizer: str | os.PathLike[str] | None = None,
) -> Path:
    """Write ``model``'s weights (``model.safetensors``, plain parameter names; a tied weight once) and
    its resolved config (``config.yaml``) into ``directory``; returns it. ``tokenizer``: a language
    model's ``tokenizer.json`` to keep beside it (byte-level models need none). ``recipe``: the
    quantization recipe to record
    (default: the one a TE model was built with). Raises ``OutputPathError`` for a directory that is not
    empty (unless ``overwrite``) or cannot be written, and ``ArgumentError`` for a model that holds one
    rank's part of a parallel layout (export its training checkpoint instead: global tensors)."""
    from te_assembly.engines.base import AssembledModel

    if not isinstance(model, AssembledModel):
        raise ArgumentError(
            f"save_pretrained() takes a model built by te_assembly.build(); got {type(model).__name__}"
        )
    weights = _weights(model)
    try:
        _check_fits(model.plan, weights, "this model's state")
    except CheckpointError:
        raise ArgumentError(
            f"{model.plan.name} holds one rank's slices of a parallel layout, not the whole model: save "
            "the training checkpoint and export it (python -m te_assembly export export.checkpoint=...), "
            "which gathers every rank's part"
        ) from None
    dtype = weights_dtype(weights)
    chosen = recipe if recipe is not None else getattr(model, "recipe", None)
    files: dict[str, str] = {}
    fingerprint = None
    if tokenizer is not None:
        path = Path(tokenizer).expanduser()
        try:
            files[TOKENIZER_FILE] = read_text(path, limit=LIMITS["tokenizer"])
        except InputFileError as exc:
            raise ArgumentError(f"save_pretrained(tokenizer=...): {exc}") from None
        fingerprint = text_fingerprint(files[TOKENIZER_FILE], str(path))
    config = config_of(model_record(model.plan), chosen, dtype, model.plan.tied_params, fingerprint)
    return write_pretrained(directory, weights, config, overwrite=overwrite, files=files)


def read_config(directory: Path) -> dict[str, Any]:
    """A pretrained directory's ``config.yaml``, read with the same limits as every config file."""
    from te_assembly.config.source import read_file

    path = directory / CONFIG_FILE
    if not path.exists() and not path.is_symlink():
        raise CheckpointError(f"{directory} is not a pretrained model directory: no {CONFIG_FILE}")
    source = read_file(str(path), "config", "", within=directory)
    errors = [d for d in source.diagnostics if d.is_error]
    if errors:
        raise ConfigError(errors)
    if not isinstance(source.data, dict) or not isinstance(source.data.get("model"), dict):
        raise CheckpointError(f"{path} holds no model (a mapping under 'model')")
    return dict(source.data)


def _load_weights(model: AssembledModel, weights: Mapping[str, torch.Tensor]) -> None:
    """Load checked weights; TE's ``_extra_state`` entries (never saved) stay the model's own."""
    own = model.state_dict()
    own_extra = {k: v for k, v in own.items() if k.endswith(_EXTRA_STATE)}
    # A frozen base without its adapters (``_check_fits`` allows it): they keep their fresh values.
    fresh = {k: v for k, v in own.items() if k in model.plan.adapter_params and k not in weights}
    model.load_state_dict({**weights, **own_extra, **fresh}, strict=True)


def _check_directory(folder: Path) -> None:
    """``CheckpointError`` unless ``folder`` is a pretrained directory (a run is told to export)."""
    recover(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a pretrained model directory (no such directory)")
    if not (folder / WEIGHTS_FILE).exists() and run_evidence(folder):
        raise CheckpointError(
            f"{folder} is a training run, not a pretrained model directory: export it first "
            f"(python -m te_assembly export {folder} DEST, or te_assembly.export_checkpoint), then load DEST"
        )


def _verified_weights(folder: Path, plan: Plan) -> dict[str, torch.Tensor]:
    """A pretrained directory's weights (the directory already checked by ``_check_directory``), every
    check ``from_pretrained`` makes done: they fit ``plan``, ``config.yaml`` matches its recorded
    checksum, nothing is NaN or inf."""
    if not (folder / WEIGHTS_FILE).exists():
        raise CheckpointError(f"{folder} is not a pretrained model directory: no {WEIGHTS_FILE}")
    header, weights = read_verified(folder / WEIGHTS_FILE, FORMAT, within=folder)
    _check_fits(plan, weights, str(folder / WEIGHTS_FILE))  # weights of another model: name them first
    recorded = header.meta.get("config_sha256")
    if recorded is not None and recorded != _sha256((folder / CONFIG_FILE).read_bytes()):
        raise CheckpointError(
            f"{folder / CONFIG_FILE} does not match the checksum recorded in {WEIGHTS_FILE}: it was edited "
            "or is corrupt (save or export the model again)"
        )
    check_finite(weights, str(folder / WEIGHTS_FILE))
    return weights


def load_pretrained_weights(model: AssembledModel, directory: str | os.PathLike[str]) -> None:
    """Load a pretrained directory's weights into ``model`` (``train.init_from``), every check of
    ``from_pretrained`` made; ``CheckpointError`` names each weight that does not fit the model."""
    folder = Path(directory).expanduser()
    _check_directory(folder)
    _load_weights(model, _verified_weights(folder, model.plan))


def from_pretrained(directory: str | os.PathLike[str], target: Target | str = "auto") -> AssembledModel:
    """Build the model saved in ``directory`` (``save_pretrained`` or the ``export`` command) on
    ``target`` and load its weights, every tensor's checksum verified first. ``target``: a ``Target``,
    or an engine name (``reference``, ``te``, ``auto``) that loads it in the saved weights' dtype; either
    takes the saved recipe when it names none (the TE engine's quantization). Returned in eval mode, as
    a model for inference (``.train()`` to train it further).

    Raises ``CheckpointError`` for a missing, corrupt or mismatched file (names every weight that does
    not fit), ``ConfigError`` for a config that does not validate, and what ``build`` raises."""
    from te_assembly.analysis.pipeline import load
    from te_assembly.engines import build

    folder = Path(directory).expanduser()
    _check_directory(folder)
    config = read_config(folder)
    analysis = load({k: v for k, v in config.items() if k in ("model", "recipe")})
    plan = analysis.checked_plan()
    weights = _verified_weights(folder, plan)
    saved = str(config.get("dtype") or "float32")
    dtype = getattr(torch, saved, None) if saved in ("float32", "float64", "bfloat16", "float16") else None
    if dtype is None:
        raise CheckpointError(f"{folder / CONFIG_FILE}: unknown dtype {saved!r}")
    model = build(analysis, for_source(target, dtype))
    _load_weights(model, weights)
    return model.eval()


def newest_checkpoint(path: Path, verb: str) -> Path:
    """``path`` itself (a checkpoint file), or a run directory's newest good checkpoint (every tensor
    verified); a corrupt newest one is refused, naming the newest good one. ``verb``: what is being done,
    for messages (``export``)."""
    from te_assembly.formats.checkpoint import newest_good, scan

    recover(path)
    if path.is_dir():
        good, problems, _ = newest_good(scan(path))
        if problems:
            listed = "\n".join(f"  {p}" for p in problems)
            advice = (
                f"the newest good checkpoint is {good.path} (step {good.step}, every tensor verified): "
                f"{verb} it with python -m te_assembly {verb} {good.path} [DEST]"
                if good is not None
                else "it holds no good checkpoint"
            )
            raise CheckpointError(f"cannot {verb} the newest checkpoint of {path}:\n{listed}\n{advice}")
        if good is None:
            raise CheckpointError(f"{path} holds no checkpoint to {verb}")
        return good.path
    if not path.exists():
        raise CheckpointError(f"cannot {verb} {path}: no such checkpoint file or run directory")
    return path


def _checkpoint_model(source: Path) -> tuple[Mapping[str, Any], Plan, dict[str, torch.Tensor]]:
    """A checkpoint's run record, its model's plan and its (global) model weights, checked to fit."""
    from te_assembly.analysis.pipeline import load

    header, weights = model_state(source)
    run = header.meta.get("run")
    if not isinstance(run, Mapping) or not isinstance(run.get("model"), Mapping):
        raise CheckpointError(f"{source} does not record its model, so it cannot be exported")
    plan = load(dict(run["model"])).checked_plan()
    if plan.adapter_params and set(weights) <= plan.adapter_params:
        weights = {**base_weights(plan, run, source), **weights}
    _check_fits(plan, weights, str(source))
    return run, plan, weights


def base_digest(named: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 of a frozen base: every tensor's name, dtype, shape and bytes, in name order. A run with
    adapters records it, so its adapters are never put on another base."""
    digest = hashlib.sha256()
    for name in sorted(named):
        tensor = named[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def base_weights(plan: Plan, run: Mapping[str, Any], source: Path) -> dict[str, torch.Tensor]:
    """The frozen base an adapters-only checkpoint was trained on: its ``train.init_from`` directory's
    weights, or the weights its seed draws; ``CheckpointError`` when that base is gone or is not the
    one the run recorded."""
    base = run.get("base")
    if not isinstance(base, Mapping):
        raise CheckpointError(f"{source} holds adapters only and does not record its base model")
    origin = base.get("init_from")
    if isinstance(origin, str):
        folder = Path(origin)
        _check_directory(folder)
        weights = _verified_weights(folder, plan)
        where = f"its train.init_from {folder}"
    else:
        dtype = getattr(torch, str(run.get("dtype") or "float32"))
        model = Target(engine="reference", dtype=dtype).build(plan, seed=int(run.get("seed") or 0))
        weights = {k: v for k, v in _weights(model).items() if k not in plan.adapter_params}
        where = f"the weights seed {run.get('seed')} draws"
    weights = {k: v for k, v in weights.items() if k not in plan.adapter_params}
    if base_digest(weights) != base.get("sha256"):
        raise CheckpointError(
            f"{source} holds adapters trained on another base than {where} (its SHA-256 differs from the "
            "one the run recorded): restore that base, or export the run where it was trained"
        )
    return weights


def from_checkpoint(checkpoint: str | os.PathLike[str], target: Target | str = "auto") -> AssembledModel:
    """The model of a training checkpoint (or a run directory's newest good one) with its weights, in
    eval mode, on ``target`` (an engine name: in the run's dtype; the run's recipe unless the target
    names one): what ``export`` writes, without writing it."""
    from te_assembly.engines import build

    source = newest_checkpoint(Path(checkpoint).expanduser(), "load")
    run, plan, weights = _checkpoint_model(source)
    dtype = getattr(torch, str(run.get("dtype") or "float32"))
    model = build(plan, for_source(target, dtype, run.get("recipe")))
    _load_weights(model, weights)
    return model.eval()


def sources_of(read_from: Path) -> list[Path]:
    """What exporting ``read_from`` reads, which no export may write over, into or around: the
    checkpoint or pretrained directory itself and, for a LoRA run's adapters-only checkpoint, the base
    it was trained on (its ``train.init_from``, whose weights the export loads)."""
    out = [read_from]
    if read_from.is_dir() and (read_from / WEIGHTS_FILE).is_file():
        return out
    try:
        base = read_meta(read_from).get("run", {}).get("base")
    except (CheckpointError, AttributeError):
        return out
    origin = base.get("init_from") if isinstance(base, Mapping) else None
    return [*out, Path(origin)] if isinstance(origin, str) else out


def export_checkpoint(
    checkpoint: str | os.PathLike[str],
    directory: str | os.PathLike[str] | None = None,
    *,
    overwrite: bool = False,
    merge: bool = False,
) -> Path:
    """A training checkpoint (or a run directory: its newest checkpoint, every tensor verified) as a
    pretrained directory (default: ``pretrained/`` in the checkpoint's run directory). The model tensors
    are global (a parallel run gathers them before saving), so the result loads in one process; a
    language model's ``tokenizer.json`` beside the run is copied with it. A run with adapters is
    written with its base and adapters, or (``merge``) as its base with the adapters folded in."""
    from te_assembly.formats.adapters import base_plan, merged_weights

    source = newest_checkpoint(Path(checkpoint).expanduser(), "export")
    target = Path(directory).expanduser() if directory is not None else source.parent / "pretrained"
    sources = sources_of(source)
    check_destination(target, PRETRAINED, overwrite=overwrite, sources=sources)
    run, plan, weights = _checkpoint_model(source)
    model_config = run["model"]
    if merge:
        if not plan.adapter_params:
            raise ArgumentError(f"{source} has no adapters to merge (export.merge=true is for LoRA runs)")
        weights, plan = merged_weights(plan, weights), base_plan(plan)
        model_config = model_record(plan)
    data = run.get("data")
    tokenizer = data.get("tokenizer") if isinstance(data, Mapping) else None
    config = config_of(
        model_config,
        run.get("recipe"),
        str(run.get("dtype") or "float32"),
        plan.tied_params,
        tokenizer if isinstance(tokenizer, str) else None,
    )
    files = read_companions(source.parent)
    return write_pretrained(target, weights, config, overwrite=overwrite, files=files, sources=sources)


__all__ = [
    "CONFIG_FILE",
    "FORMAT",
    "TOKENIZER_FILE",
    "WEIGHTS_FILE",
    "base_digest",
    "base_weights",
    "export_checkpoint",
    "from_checkpoint",
    "from_pretrained",
    "save_pretrained",
    "sources_of",
    "write_pretrained",
]
