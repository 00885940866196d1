"""How many positions a job shows a model at once (``eval.seq_len``, ``generate.context``), decided before
any text is read: the setting, else the model's context (``eval``: at most ``DEFAULT``, since a batch of
windows of a long context costs its logits over the vocabulary), and never more than that context.

A model's context is the one it was trained at, where it is recorded: an imported checkpoint's
``max_position_embeddings`` (its ``hf_config.json``, kept in the pretrained directory and in a run started
from it). A model without one (trained here from scratch) has no such bound; ``DEFAULT`` is then the
window, and what a window of the size asked would hold in memory is checked instead (``check_window_fits``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from te_assembly.analysis.plan import Plan
from te_assembly.diagnostics import error
from te_assembly.engines.base import AssembledModel
from te_assembly.engines.memory import available_bytes, format_bytes, fused_attention, step_activation_bytes
from te_assembly.errors import ConfigError, ResourceError
from te_assembly.formats.companions import SOURCE_CONFIG, companion_json

DEFAULT = 1024
"""The window of a model whose context is not recorded, when the setting is null."""


def model_context(source: Path | None) -> int | None:
    """The context ``source`` (a pretrained directory, a run directory or a checkpoint in one) records;
    None when it records none."""
    if source is None:
        return None
    folder = source if source.is_dir() else source.parent
    data = companion_json(folder, SOURCE_CONFIG) if folder.is_dir() else None
    value = data.get("max_position_embeddings") if data else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def window(given: int | None, source: Path | None, key: str, model: str, at_most: int | None = None) -> int:
    """The positions a job's window holds (module docstring; ``at_most``: a null setting takes no more
    than this, where the model's context would be a costly default); ``ConfigError`` at ``key`` for a
    setting past the model's context."""
    context = model_context(source)
    if given is None:
        chosen = context or DEFAULT
        return min(chosen, at_most) if at_most is not None else chosen
    if context is not None and given > context:
        message = (
            f"{key}={given} is more than {model}'s context of {context:,} positions (max_position_embeddings "
            "of the checkpoint it was imported from): it never saw a window that long"
        )
        hint = f"use {key}={context} or less, or leave it null for the model's context"
        raise ConfigError([error(key, "out-of-range", message, hint)])
    return given


def check_model_window_fits(model: AssembledModel, rows: int, positions: int, key: str) -> None:
    """``check_window_fits`` for a built ``model``, on the device and in the dtype of its parameters,
    its attention fused where it runs in TE's own kernels (the TE engine) or SDPA's."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    fused = fused_attention(model.engine, "te", device, dtype)
    check_window_fits(model.plan, rows, positions, device, dtype, key, fused)


def check_window_fits(
    plan: Plan,
    rows: int,
    positions: int,
    device: torch.device,
    dtype: torch.dtype,
    key: str,
    fused: bool = True,
) -> None:
    """``ResourceError`` before any forward when ``rows`` windows of ``positions`` would not fit in
    ``device``'s free memory: without gradients, a forward holds a step's input and output at once, so
    about twice the largest step's activations (``engines/memory.py``; ``fused``: attention in a fused
    kernel, which holds no probabilities)."""
    needed = 2 * max(step_activation_bytes(plan, rows * positions, dtype, positions, fused), default=0)
    have = available_bytes(device)
    if have is not None and needed > have[0]:
        raise ResourceError(
            f"{rows} window(s) of {positions:,} positions need about {format_bytes(needed)} of {device.type} "
            f"memory at the largest step of {plan.name}, but only {format_bytes(have[0])} is available "
            f"({have[1]}); lower {key}. Nothing was allocated."
        )


__all__ = ["DEFAULT", "check_model_window_fits", "check_window_fits", "model_context", "window"]
