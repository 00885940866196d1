"""How a block's uses are named: each use's steps and channels under its prefix (``layers.3.``), and
a mistake that concerns several uses named by their ranges (``model.layers[0-23]``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def related(name: str, other: Any) -> bool:
    """Two step names that cannot both be model steps: equal, or one the other's scope."""
    return isinstance(other, str) and (
        other == name or other.startswith(name + ".") or name.startswith(other + ".")
    )


def scoped(ops: list[Any], prefix: str) -> list[Any]:
    """One use's steps: names and channels prefixed (``layers.3.``); anything else is shared between
    uses (read-only from here on). Values that are not names are left for the analysis to report."""
    out: list[Any] = []
    for op in ops:
        if not isinstance(op, dict):
            out.append(op)
            continue
        new = dict(op)
        name = op.get("name")
        if isinstance(name, str):
            new["name"] = prefix + name
        inputs = op.get("extra_inputs")
        if isinstance(inputs, dict):
            new["extra_inputs"] = {
                k: prefix + v if isinstance(v, str) and v else v for k, v in inputs.items()
            }
        outputs = op.get("extra_outputs")
        if isinstance(outputs, dict):
            new["extra_outputs"] = {k: scoped_binding(b, prefix) for k, b in outputs.items()}
        out.append(new)
    return out


def scoped_binding(binding: Any, prefix: str) -> Any:
    if isinstance(binding, dict):
        channel = binding.get("channel")
        if isinstance(channel, str) and channel:
            return {**binding, "channel": prefix + channel}
    return binding


def use_ranges(uses: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    parts: list[str] = []
    start = prev = None
    for u in sorted(uses):
        if prev is not None and u == prev + 1:
            prev = u
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = u
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def use_path(group: str, block: str, uses: Sequence[int], local: str) -> str:
    """How a diagnostic inside a block names the uses it concerns: ``model.layers[3] (block moe_layer):
    ops[4].extra_inputs.addend``, ``model.layers[0-23] (...)`` for a mistake every use shares."""
    return f"model.{group}[{use_ranges(uses)}] (block {block}): {local}"


__all__ = ["related", "scoped", "scoped_binding", "use_path", "use_ranges"]
