"""One model's weights into another's: the same names on both sides, TE's quantization metadata kept
by the target (``verify`` and ``bench`` compare engines on the same weights)."""

from __future__ import annotations

import torch

from te_assembly.errors import VerificationError

EXTRA_STATE = "._extra_state"
"""TE ops' state-dict entries of quantization metadata (FP8 scales, amax history): no other engine
has them."""


def _engine_name(model: torch.nn.Module) -> str:
    return str(getattr(model, "engine", type(model).__name__))


def copy_weights(source: torch.nn.Module, target: torch.nn.Module) -> None:
    """Load ``source``'s weights into ``target``. Strict: the two state dicts hold the same names, every
    parameter and buffer, or ``VerificationError`` names what is only in one. The one exception is TE's
    ``_extra_state`` entries (quantization metadata, which no other engine has): never copied, and the
    target keeps its own."""
    src = {k: v for k, v in source.state_dict().items() if not k.endswith(EXTRA_STATE)}
    tgt = target.state_dict()
    own_extra = {k: v for k, v in tgt.items() if k.endswith(EXTRA_STATE)}
    missing = sorted(set(tgt) - set(own_extra) - set(src))
    unexpected = sorted(set(src) - set(tgt))
    if missing or unexpected:
        a, b = _engine_name(source), _engine_name(target)
        raise VerificationError(
            f"parameter names differ between the {a} and {b} engines: "
            f"only in {b}: {missing or 'none'}; only in {a}: {unexpected or 'none'}"
        )
    target.load_state_dict({**src, **own_extra}, strict=True)


__all__ = ["EXTRA_STATE", "copy_weights"]
