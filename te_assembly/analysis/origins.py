"""Diagnostics of an expanded model, put back where the user wrote things.

The model passes check the expanded model (``config/blocks.py``), whose steps are numbered
``model.ops[K]`` across every use of every block. Here each such diagnostic moves to its source:

- a step of the model's own: ``model.ops[j]``, ``j`` its index in the model file as written;
- a step of a block's use: ``model.layers[3] (block moe_layer): ops[4].extra_inputs.addend``, located at
  the line of ``ops[4].extra_inputs.addend`` in the block's file (or under the model's ``blocks:``).

Step and channel names in messages name the uses as ``explain`` does (``'layers.3.norm'`` reads
``'layers[3].norm'``, and ``'layers[0-23].norm'`` once the uses are merged); hints keep the names as the
block writes them (``'norm'``: what to type); other step references are rewritten the same way, so a
mistake in a block reads the same in every use.
Identical diagnostics of several uses become one, naming every use it affects
(``model.layers[0-23] (block moe_layer): ...``): a mistake in a block used 24 times is reported once, and
a mistake only some uses make (through their own dims) names just those.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace

from te_assembly.config.block_names import use_path, use_ranges
from te_assembly.config.blocks import Expansion, Origin
from te_assembly.diagnostics import Diagnostic, Severity

_STEP_PATH = re.compile(r"^model\.ops\[(\d+)\]")
_USES = "\x00uses\x00"
"""Stands in a message for its use's index until the uses sharing the message are known."""
_STEP_REF = re.compile(r"model\.ops\[(\d+)\]")


def present(diagnostics: Iterable[Diagnostic], expansion: Expansion | None) -> list[Diagnostic]:
    """``diagnostics`` of the expanded model, each at its source (module docstring)."""
    if expansion is None:
        return list(diagnostics)
    out: list[Diagnostic] = []
    grouped: dict[tuple[int, str, str, Severity, str, str | None], list[int]] = {}
    for d in diagnostics:
        m = _STEP_PATH.match(d.path)
        origin = _origin(expansion, int(m.group(1))) if m is not None else None
        if m is None or origin is None or origin.group < 0:
            path = (
                d.path if m is None or origin is None else f"model.ops[{origin.position}]{d.path[m.end() :]}"
            )
            message, hint = _text(d.message, expansion), _hint(d.hint, expansion)
            out.append(replace(d, path=path, message=message, hint=hint))
            continue
        local = f"ops[{origin.local}]{d.path[m.end() :]}"
        message = _text(d.message, expansion, origin)
        hint = _hint(d.hint, expansion, origin)
        grouped.setdefault((origin.group, local, d.code, d.severity, message, hint), []).append(origin.use)
    for (g, local, code, severity, message, hint), uses in grouped.items():
        group, where = expansion.groups[g], expansion.where[g]
        shown = use_ranges(uses)
        message = message.replace(_USES, shown)
        moved = Diagnostic(severity, use_path(group.name, group.block, uses, local), message, code, hint)
        out.append(moved.located(where.file, where.line(local)))
    return out


def _origin(expansion: Expansion, index: int) -> Origin | None:
    return expansion.origins[index] if 0 <= index < len(expansion.origins) else None


def _hint(hint: str | None, expansion: Expansion, origin: Origin | None = None) -> str | None:
    # A hint's names are what to write in the block: without the use's prefix.
    return None if hint is None else _text(hint, expansion, origin, local=True)


def _text(text: str, expansion: Expansion, context: Origin | None = None, local: bool = False) -> str:
    """``text`` with step references (``model.ops[K]``) as the user wrote them and, inside a use, that
    use's names without their prefix."""

    def step_ref(m: re.Match[str]) -> str:
        origin = _origin(expansion, int(m.group(1)))
        if origin is None:
            return m.group(0)
        if origin.group < 0:
            return f"model.ops[{origin.position}]"
        if context is not None and (origin.group, origin.use) == (context.group, context.use):
            return f"ops[{origin.local}]"
        return f"ops[{origin.local}] of model.{expansion.groups[origin.group].name}[{origin.use}]"

    text = _STEP_REF.sub(step_ref, text)
    if context is not None and context.group >= 0:
        group = expansion.groups[context.group]
        prefix, named = group.prefix(context.use), "" if local else f"{group.name}[{_USES}]."
        text = text.replace(f"'{prefix}", f"'{named}").replace(f'"{prefix}', f'"{named}')
    return text


__all__ = ["present"]
