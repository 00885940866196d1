"""``explain``'s LoRA table: which steps carry adapters, what trains, what training them holds in memory
against training every weight, and which of TE's fusions the branches take part in or miss. Pure Python:
no torch (sizes per dtype by name)."""

from __future__ import annotations

import re

from rich.table import Table
from rich.text import Text

from te_assembly.analysis.fusions import FusionTarget, predict
from te_assembly.analysis.plan import Plan
from te_assembly.catalog import ADAPTER_TYPES
from te_assembly.catalog.adapter_ops import adapted_parts, parts_of, scaling

DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
ADAMW_STATES = 2
"""Tensors of parameter size AdamW keeps per trained parameter (``engines/memory.py`` counts the same)."""


def _use_pattern(name: str) -> str:
    return re.sub(r"\.(\d+)\.", "[*].", name)


def _mib(count: int) -> str:
    return f"{count / 2**20:,.1f} MiB"


def adapter_table(plan: Plan, target: FusionTarget) -> Table | None:
    """The table, or None for a plan without adapters."""
    adapters = [s for s in plan.steps if s.type in ADAPTER_TYPES]
    if not adapters:
        return None
    table = Table(title="LoRA adapters (only they train; the base is frozen)", title_justify="left")
    table.add_column("what")
    table.add_column("value", max_width=90)
    adapted: dict[str, str] = {}
    for step in adapters:
        parts = parts_of(step.args)
        names = ("q", "k", "v") if len(parts) == 3 else ("gate", "up") if len(parts) == 2 else ()
        chosen = [names[i] for i in adapted_parts(step.args)] if names else []
        shown = _use_pattern(step.name.removesuffix("_lora"))
        adapted[shown] = f"{shown}" + (f" ({','.join(chosen)})" if chosen else "")
    first = adapters[0].args
    table.add_row("adapted steps", Text(", ".join(adapted.values())))
    rule = "alpha / sqrt(rank)" if first.get("rslora") else "alpha / rank"
    table.add_row(
        "rank, alpha, scaling",
        f"{first['rank']}, {first['alpha']}, {scaling(first):g} ({rule}); dropout {first['dropout']}",
    )
    trained, total = plan.num_trainable_params, plan.num_params
    table.add_row("trainable parameters", f"{trained:,} of {total:,} ({100 * trained / max(total, 1):.2f}%)")
    size = DTYPE_BYTES.get(target.dtype, 4)
    full = total * size * (1 + ADAMW_STATES)
    lora = trained * size * (1 + ADAMW_STATES)
    table.add_row(
        "gradients + AdamW state",
        f"{_mib(lora)} with adapters, {_mib(full)} training every weight ({100 * lora / max(full, 1):.2f}%), "
        f"{target.dtype}; the frozen base's {_mib(total * size)} stay",
    )
    table.add_row("TE fusions at the branches", Text(_fusions(plan, target)))
    return table


def _fusions(plan: Plan, target: FusionTarget) -> str:
    """The fused ops that involve an adapter's steps, fired or missed, counted by name."""
    if target.kernels != "te":
        return "none: kernels=reference"
    branch = {s.name for s in plan.steps if s.type in ADAPTER_TYPES}
    branch |= {s.name.removesuffix("_lora") + "_lora_in" for s in plan.steps if s.type in ADAPTER_TYPES}
    fired: dict[str, int] = {}
    missed: dict[str, int] = {}
    for fuser in predict(plan, target):
        for f in fuser.fired:
            if branch & set(f.steps):
                fired[f.fusion.name] = fired.get(f.fusion.name, 0) + 1
        for m in fuser.near_misses:
            if branch & set(m.steps):
                missed[m.fusion.name] = missed.get(m.fusion.name, 0) + 1
    parts = [f"{name} fires x{n}" for name, n in fired.items()]
    parts += [f"{name} missed x{n} (see the TE fusions table)" for name, n in missed.items()]
    return "; ".join(parts) or "none involve the branches; the frozen projections keep theirs"
