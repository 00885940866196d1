"""What a training checkpoint holds of a model: its whole state, or, for a frozen base with LoRA
adapters, the adapters only (every checkpoint layout asks here: one file, a gathered parallel state, DCP
pieces)."""

from __future__ import annotations

from typing import Any

import torch


def adapter_names(model: object) -> frozenset[str]:
    """The adapters' parameter names of a model (or of a view with a ``plan``) whose base is frozen;
    empty for a model that trains every weight. A frozen base is the model's source's to keep (its
    ``train.init_from`` or its seed): a checkpoint holds only what trains."""
    plan = getattr(model, "plan", None) or getattr(getattr(model, "model", None), "plan", None)
    names = getattr(plan, "adapter_params", None)
    return names if isinstance(names, frozenset) else frozenset()


def checkpoint_state(model: torch.nn.Module) -> dict[str, Any]:
    """What a checkpoint holds of ``model``: its state dict, or only its adapters' part of it."""
    state = model.state_dict()
    keep = adapter_names(model)
    return {k: v for k, v in state.items() if k in keep} if keep else dict(state)
