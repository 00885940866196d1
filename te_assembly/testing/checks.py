"""The checks a config folder's tests run, as plain functions: they raise ``ConfigCheckError`` (an
``AssertionError``) whose message is te_assembly's own diagnostics, and return what they checked.

``assert_valid`` and ``assert_diagnostics`` are the public ones (``te_assembly.testing``); the pytest
plugin (``plugin.py``) calls the same functions for every model, block and recipe of a folder.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from te_assembly.analysis.analyze import COMMON, DEFAULT_SECTIONS, Analysis
from te_assembly.analysis.pipeline import load, load_model_file
from te_assembly.catalog import MODULE_ALLOWLIST, OPS
from te_assembly.catalog.devices import ACCELERATORS
from te_assembly.config.source import read_file
from te_assembly.diagnostics import Diagnostic, did_you_mean, error
from te_assembly.errors import CompositionError, ConfigCheckError, ConfigError
from te_assembly.testing.expect import Expected, compare

Config = str | os.PathLike[str] | Mapping[str, Any]

WIDTH_DIMS = ("hidden", "in_features", "width", "d_model")
"""A block's dims that give its input width, in the order tried, for the minimal model that uses it."""


def _needs_sequence(step: Any) -> bool:
    """Whether a block step needs ``[batch, seq, features]`` (attention), as the catalog says."""
    if not isinstance(step, dict):
        return False
    spec = MODULE_ALLOWLIST.get(step.get("module", "")) or OPS.get(step.get("op", ""))
    return spec is not None and spec.needs_layout == "sequence"


def _describe(config: Config, overrides: Sequence[str]) -> str:
    name = str(config) if not isinstance(config, Mapping) else str(config.get("name", "model"))
    return name + (f" [{' '.join(overrides)}]" if overrides else "")


def diagnostic_lines(diagnostics: Iterable[Diagnostic]) -> list[str]:
    """Each diagnostic as ``validate`` prints it (file:line, key path, message and hint), indented."""
    return [f"  {d.format()}" for d in diagnostics]


def analyze(
    config: Config,
    overrides: Sequence[str] = (),
    config_dirs: Sequence[str | os.PathLike[str]] = (),
    sections: Mapping[str, type] | None = None,
) -> Analysis:
    """``te_assembly.load`` of ``config`` (a model file through ``load_model_file``: Hydra composes the
    rest once per override set, not once per file); what cannot even be composed (a recipe that does
    not exist, an override Hydra refuses) is a ``ConfigCheckError`` saying so."""
    try:
        if isinstance(config, os.PathLike) and Path(config).is_file():  # the plugin's files: see below
            return load_model_file(config, list(overrides), config_dirs=list(config_dirs), sections=sections)
        return load(config, list(overrides), config_dirs=list(config_dirs), sections=sections)
    except CompositionError as exc:
        raise ConfigCheckError(f"{_describe(config, overrides)}: {exc}") from None
    except ConfigError as exc:  # a file Hydra could not even read (a YAML syntax error)
        text = [f"{_describe(config, overrides)} cannot be read", *diagnostic_lines(exc.diagnostics)]
        raise ConfigCheckError("\n".join(text)) from None


def assert_valid(
    config: Config,
    overrides: Sequence[str] = (),
    config_dirs: Sequence[str | os.PathLike[str]] = (),
    sections: Mapping[str, type] | None = None,
) -> Analysis:
    """``config`` (a model name, a model file or a model mapping; ``config_dirs`` as ``-cd``) validates
    under ``overrides`` with no error; warnings are allowed. Returns the analysis."""
    analysis = analyze(config, overrides, config_dirs, sections)
    errors = [d for d in analysis.diagnostics if d.is_error]
    if errors:
        text = [
            f"{_describe(config, overrides)} does not validate: {len(errors)} error(s)",
            *diagnostic_lines(errors),
        ]
        raise ConfigCheckError("\n".join(text))
    return analysis


def assert_diagnostics(
    config: Config,
    expected: Iterable[Expected | Mapping[str, Any]],
    overrides: Sequence[str] = (),
    config_dirs: Sequence[str | os.PathLike[str]] = (),
) -> Analysis:
    """Validating ``config`` reports exactly ``expected``: each a mapping (or ``Expected``) of ``code``,
    ``path`` and optionally ``severity`` (default ``error``), warnings included. What is missing and
    what is extra are both named. Returns the analysis."""
    analysis = analyze(config, overrides, config_dirs)
    check_expected(_describe(config, overrides), analysis.diagnostics, expected)
    return analysis


def check_expected(
    what: str, found: Sequence[Diagnostic], expected: Iterable[Expected | Mapping[str, Any]]
) -> None:
    """``found`` is exactly ``expected``; ``ConfigCheckError`` naming what is missing and what is extra."""
    missing, extra = compare([Expected.of(e) for e in expected], found)
    if not (missing or extra):
        return
    text = [f"{what}: the diagnostics differ from the expected ones"]
    if missing:
        text.append("expected, not reported:")
        codes = sorted({d.code for d in found})
        for e in missing:
            hint = did_you_mean(e.code, codes) if e.code not in codes else None
            text.append(f"  {e.describe()}" + (f" ({hint})" if hint else ""))
    if extra:
        text.append("reported, not expected:")
        text.extend(diagnostic_lines(extra))
    raise ConfigCheckError("\n".join(text))


def assert_recipe(
    path: str | os.PathLike[str], expected: Iterable[Expected | Mapping[str, Any]] | None = None
) -> None:
    """The recipe file ``path`` is a valid recipe (the schema of its ``kind``, field by field), or
    reports exactly ``expected``."""
    from te_assembly.analysis.recipes import validate_recipe

    source = read_file(str(path), "recipe", "recipe")
    found: list[Diagnostic] = list(source.diagnostics)
    if source.ok:
        if isinstance(source.data, dict):
            found = [source.locate(d) for d in validate_recipe(source.data, prefix="recipe")]
        else:
            found = [source.locate(error("recipe", "wrong-type", "a recipe file holds a mapping"))]
    if expected is not None:
        check_expected(str(path), found, expected)
        return
    errors = [d for d in found if d.is_error]
    if errors:
        raise ConfigCheckError(
            "\n".join([f"{path} is not a valid recipe: {len(errors)} error(s)", *diagnostic_lines(errors)])
        )


def block_model(name: str, block_file: Path, model: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The smallest model that uses block ``name``: one step, its input width from ``model`` (a
    sidecar's ``model:``) or the block's own dims (``WIDTH_DIMS``), its layout from ``model`` or the
    block (``sequence`` when it holds an Attention module)."""
    given = dict(model or {})
    source = read_file(str(block_file), "block", f"block.{name}")
    data: dict[str, Any] = source.data if source.ok and isinstance(source.data, dict) else {}
    raw_dims = data.get("dims")
    dims: dict[str, Any] = raw_dims if isinstance(raw_dims, dict) else {}
    width = given.get("in_features")
    if width is None:
        width = next((dims[k] for k in WIDTH_DIMS if isinstance(dims.get(k), int)), None)
    if width is None:
        raise ConfigCheckError(
            f"{block_file}: the block's input width is not one of its dims ({', '.join(WIDTH_DIMS)}): "
            f"give it in {block_file.name.removesuffix('.yaml')}.expect.yaml as model: {{in_features: N}}"
        )
    raw_ops = data.get("ops")
    ops: list[Any] = raw_ops if isinstance(raw_ops, list) else []
    layout = given.get("input_layout", "sequence" if any(map(_needs_sequence, ops)) else "tokens")
    step: dict[str, Any] = {"name": "use", "block": name}
    if given.get("dims"):
        step["dims"] = dict(given["dims"])
    return {
        "name": f"{name}_check",
        "description": f"the smallest model using block {name} (te_assembly.testing)",
        "in_features": width,
        "input_layout": layout,
        "ops": [step],
    }


def assert_fits(analysis: Analysis, target: str, tokens: int | None = None) -> str:
    """The plan trains on one ``target`` accelerator (``catalog/devices.py``) per rank of its parallel
    layout (``rank_needs``). Returns the estimate in words."""
    if target not in ACCELERATORS:
        hint = did_you_mean(target, list(ACCELERATORS)) or f"one of {', '.join(ACCELERATORS)}"
        raise ConfigCheckError(f"unknown memory target {target!r}: {hint}")
    from te_assembly.engines.memory import format_bytes

    device = ACCELERATORS[target]
    needed, words = rank_needs(analysis, tokens)
    if needed > device.memory_bytes:
        raise ConfigCheckError(
            f"{words} does not fit a {device.name} ({format_bytes(device.memory_bytes)}): shard it "
            "(parallel.tensor, parallel.expert), lower train.batch_tokens or make the model smaller"
        )
    return f"{words}: fits a {device.name} ({format_bytes(device.memory_bytes)})"


def rank_needs(analysis: Analysis, tokens: int | None = None) -> tuple[int, str]:
    """Bytes the fullest rank of the plan's parallel layout needs to train, and that in words: its
    parameters, gradients, optimizer state and the activations of its share of ``train.batch_tokens``
    rows (``engines/memory.py``), in the config's dtype."""
    import torch

    from te_assembly.engines.memory import format_bytes, rank_estimate
    from te_assembly.engines.target import DTYPES

    plan, layout = analysis.checked_plan(), analysis.layout
    train = analysis.section("train") if "train" in analysis.sections else None
    if train is not None:
        train = train.for_task(analysis.checked_plan().takes_token_ids)
    rows = tokens if tokens is not None else (train.batch_tokens if train is not None else 0)
    seq_len = train.seq_len if train is not None else None
    optimizer = train.optimizer if train is not None else "adamw"
    dtype: torch.dtype = DTYPES[analysis.section(COMMON).dtype]
    assert layout is not None
    needed = rank_estimate(plan, layout, dtype, tokens=rows, optimizer=optimizer, seq_len=seq_len)
    ranks = layout.settings.world_size
    per = f"per rank of {ranks}" if ranks > 1 else "on one device"
    return needed.total, f"{plan.name}: {format_bytes(needed.total)} {per} ({needed.describe()})"


def sections_with_train() -> dict[str, type]:
    """The sections a memory check reads: the defaults and ``train:`` (its batch and optimizer)."""
    from te_assembly.jobs.train.settings import TrainSettings

    return {**DEFAULT_SECTIONS, "train": TrainSettings}


def build_on_meta(analysis: Analysis) -> int:
    """Construct the reference engine's model on torch's ``meta`` device (shapes, no memory): every
    module, parameter and binding is made as it would be. Returns the parameter count built."""
    import torch

    from te_assembly.engines.reference.model import build_reference

    plan = analysis.checked_plan()
    model = build_reference(plan, device=torch.device("meta"), dtype=torch.float32)
    count = sum(p.numel() for p in model.parameters())
    if count != plan.num_params:
        raise ConfigCheckError(
            f"{plan.name}: built {count:,} parameters, the plan counts {plan.num_params:,}"
        )
    return count


def smoke(analysis: Analysis, tokens: int = 8) -> float:
    """One forward and backward of ``tokens`` rows on the CPU with the reference engine (the ``run`` job);
    returns the loss."""
    from te_assembly.analysis.settings import RunSettings
    from te_assembly.engines.target import Target
    from te_assembly.jobs.run import run

    plan = analysis.checked_plan()
    seq_len = min(analysis.section("run").seq_len, tokens)
    rows = tokens if plan.input_layout != "sequence" else seq_len * max(1, tokens // seq_len)
    result = run(plan, Target("reference"), RunSettings(steps=1, tokens=rows, seq_len=seq_len))
    return result.loss


def build_with_te(analysis: Analysis) -> str:
    """Build through TE's real ``OperationFuser`` on this machine (``kernels=reference`` without a GPU);
    returns what was built."""
    import torch

    from te_assembly.engines import Target, build

    plan = analysis.checked_plan()
    kernels = "te" if torch.cuda.is_available() else "reference"
    model = build(plan, Target.of("te", kernels=kernels))
    return f"{plan.name}: engine {model.engine}, kernels {kernels}"


__all__ = [
    "WIDTH_DIMS",
    "analyze",
    "assert_diagnostics",
    "assert_fits",
    "assert_recipe",
    "assert_valid",
    "block_model",
    "build_on_meta",
    "build_with_te",
    "check_expected",
    "diagnostic_lines",
    "sections_with_train",
    "smoke",
]
