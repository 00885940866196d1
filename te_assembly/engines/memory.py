"""How much memory a plan needs, estimated before anything is allocated, and whether this machine has it.

A size that cannot be allocated (``model.dims.ffn=100000000000``, ``run.tokens=10000000000000``) would
otherwise fail deep inside torch with an allocator traceback, or worse, be granted lazily by the kernel
and get the process killed once the pages are touched. Everything here comes from the plan and the
catalog (parameter shapes, slot shapes, widths, rows per step), in exact integers: a size beyond int64
is just a very large estimate, refused like any other before it can reach torch.

What each step keeps for backward is its catalog entry's declaration (``catalog/costs.py``), so the
estimate is simple and errs a little high: on every shipped model it is 1.0 to 1.5 times the peak
measured on the CPU (``tests/engines/test_memory_peak.py``). A refusal means the work does not fit.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from te_assembly.analysis.parallel.layout import ShardPlan, rank_elements
from te_assembly.analysis.plan import Plan
from te_assembly.catalog.costs import Work
from te_assembly.engines.data import rows_per_step
from te_assembly.errors import ResourceError

INT_BYTES = 8
"""Integer channels (split sizes, routing maps, row maps) are int64."""

OPTIMIZER_STATES = {"adamw": 2, "sgd": 1, None: 0}
"""Tensors of parameter size an optimizer keeps per parameter (AdamW: two moments; SGD: momentum)."""


def dtype_bytes(dtype: torch.dtype) -> int:
    return dtype.itemsize


def parameter_count(plan: Plan) -> int:
    """Parameter elements; a tied weight is one tensor (counted at the step it is tied to)."""
    return plan.num_params


def _rows_per_step(plan: Plan, tokens: int) -> list[int]:
    """Rows of the main tensor arriving at each step: Dispatch multiplies by top_k, Combine divides."""
    rows = rows_per_step(plan, tokens)
    return [rows[step.index] for step in plan.steps]


def _slot_elements(shape: str, rows: int, width: int, args: dict[str, object]) -> int:
    if shape == "main":
        return rows * width
    if shape == "rows":
        return rows
    if shape == "token_topk":
        return rows * int(args.get("top_k", 1))  # type: ignore[call-overload]
    if shape == "groups":
        return int(args.get("num_groups", args.get("num_experts", 1)))  # type: ignore[call-overload]
    return 1


def attention_elements(args: dict[str, object], rows: int, seq_len: int, fused: bool = False) -> int:
    """What an ``Attention`` step keeps for backward beyond its input and output, in elements of the
    compute dtype, as its catalog entry declares it (``catalog/costs.py``): q, k and v, and the
    probabilities, or with ``fused`` (SDPA's flash or memory-efficient kernels, TE's fused backends) one
    log-sum-exp per row and head instead."""
    from te_assembly.catalog import MODULE_ALLOWLIST

    return MODULE_ALLOWLIST["Attention"].cost.saved(args, Work(rows, seq_len, fused=fused))


def fused_attention(engine: str, kernels: str, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether attention runs in a fused kernel (no probabilities kept for backward): everywhere but
    TE's ``DotProductAttention`` in float32 on a GPU (its unfused backend). The reference module's
    ``twice_differentiable`` mode (the math backend) is for gradient checks and is not estimated."""
    te_unfused = engine == "te" and kernels == "te" and device.type == "cuda" and dtype == torch.float32
    return not te_unfused


def _input_bytes(plan: Plan, tokens: int, size: int) -> int:
    # A language model's x is int64 token ids, one per position (in_features is its vocabulary).
    return tokens * INT_BYTES if plan.takes_token_ids else tokens * plan.in_features * size


def step_activation_bytes(
    plan: Plan, tokens: int, dtype: torch.dtype, seq_len: int | None = None, fused: bool = False
) -> list[int]:
    """What each step's forward keeps for backward, as its catalog entry declares it (``Cost``): its main
    input unless it only adds, scales or moves it, what it keeps beyond (attention's heads and
    probabilities), and its extra outputs."""
    size = dtype_bytes(dtype)
    out = []
    for step, rows in zip(plan.steps, _rows_per_step(plan, tokens), strict=True):
        cost = step.spec.cost
        kept = rows * (step.in_width or 0) * size if cost.keeps_input else 0
        for slot in step.output_slots:
            elements = _slot_elements(slot.shape, rows, step.in_width or 0, step.args)
            kept += elements * (INT_BYTES if slot.dtype == "int" else size)
        work = Work(rows, min(seq_len or rows, rows), fused=fused)
        # what an op keeps beyond its input is computed in at least float32 (attention's softmax)
        kept += cost.saved(step.args, work) * max(size, 4) if rows else 0
        out.append(kept)
    return out


def activation_bytes(
    plan: Plan,
    tokens: int,
    dtype: torch.dtype,
    seq_len: int | None = None,
    fused: bool = False,
    checkpointing: str = "none",
) -> int:
    """What one forward keeps for backward: ``x``, what each step keeps (``step_activation_bytes``) and
    the output (sequences of ``seq_len`` rows; default: one sequence of all ``tokens``; ``fused``: see
    ``attention_elements``).

    ``checkpointing`` (``train.activation_checkpointing``): a recomputed unit keeps only its input
    between forward and backward, and in backward the largest one holds all it would have kept while
    it is recomputed. ``blocks``: each block use (a model without blocks: the whole forward); ``all``:
    each step."""
    size = dtype_bytes(dtype)
    per_step = step_activation_bytes(plan, tokens, dtype, seq_len, fused)
    rows = _rows_per_step(plan, tokens)
    total = _input_bytes(plan, tokens, size) + tokens * plan.out_features * size
    if checkpointing == "none":
        return total + sum(per_step)
    if checkpointing == "all":
        units = [range(i, i + 1) for i in range(len(plan.steps))]
    elif plan.blocks:
        units = [use.steps for g in plan.blocks for use in g.uses]
    else:
        units = [range(len(plan.steps))]
    inside = {i for unit in units for i in unit}
    total += sum(b for i, b in enumerate(per_step) if i not in inside)
    for unit in units:
        first = plan.steps[unit[0]]
        total += rows[unit[0]] * (first.in_width or 0) * size  # the unit's input, kept to recompute from
    return total + max((sum(per_step[i] for i in unit) for unit in units), default=0)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes, by what they hold."""

    parameters: int
    gradients: int
    optimizer: int
    activations: int

    loss: int = 0
    """A language model's cross-entropy buffers: float32 log-probabilities of every position over the
    vocabulary kept for backward, their gradient, and the float32 copy of narrower logits. At large
    vocabularies they outweigh the rest of the activations."""

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.activations + self.loss

    def describe(self) -> str:
        parts = [
            (name, value)
            for name, value in (
                ("parameters", self.parameters),
                ("gradients", self.gradients),
                ("optimizer state", self.optimizer),
                ("activations", self.activations),
                ("cross-entropy buffers", self.loss),
            )
            if value
        ]
        return ", ".join(f"{name} {format_bytes(value)}" for name, value in parts) or "nothing"


def estimate(
    plan: Plan,
    dtype: torch.dtype,
    *,
    tokens: int = 0,
    models: int = 1,
    trained: int = 0,
    optimizer: str | None = None,
    seq_len: int | None = None,
    fused_attention: bool = False,
    checkpointing: str = "none",
) -> MemoryEstimate:
    """``models`` copies of the parameters (e.g. teacher and student), ``trained`` of them with
    gradients and ``optimizer`` state, and the activations of one forward+backward of ``tokens`` rows
    (in sequences of ``seq_len`` for attention; default: one sequence; ``fused_attention``: TE's fused
    attention kernels, see ``attention_elements``; ``checkpointing``: see ``activation_bytes``)."""
    return _footprint(
        plan,
        parameter_count(plan),
        dtype,
        tokens,
        models,
        trained,
        optimizer,
        seq_len,
        fused_attention,
        checkpointing,
    )


def _footprint(
    plan: Plan,
    elements: int,
    dtype: torch.dtype,
    tokens: int,
    models: int,
    trained: int,
    optimizer: str | None,
    seq_len: int | None,
    fused: bool,
    checkpointing: str = "none",
    gathered: int = 0,
    others: int | None = None,
) -> MemoryEstimate:
    """``trained`` copies of ``elements`` parameters with gradients and optimizer state, ``models -
    trained`` more of ``others`` (default ``elements``) without, one forward+backward of ``tokens`` rows,
    and ``gathered`` elements FSDP2 holds whole (parameters and gradients) while a unit runs."""
    size = dtype_bytes(dtype)
    params = elements * size
    untrained = (elements if others is None else others) * size * (models - trained)
    # A frozen base with adapters: only the adapters' share has gradients and optimizer state.
    share = plan.num_trainable_params / plan.num_params if plan.num_params else 1.0
    learned = math.ceil(params * share)
    return MemoryEstimate(
        parameters=params * trained + untrained + gathered * size,
        gradients=learned * trained + math.ceil(gathered * size * share) * trained,
        optimizer=learned * trained * OPTIMIZER_STATES.get(optimizer, 2),
        activations=activation_bytes(plan, tokens, dtype, seq_len, fused, checkpointing)
        + gradient_bytes(plan, tokens, dtype)
        if tokens
        else 0,
        loss=loss_bytes(plan, tokens, dtype),
    )


def gradient_bytes(plan: Plan, tokens: int, dtype: torch.dtype) -> int:
    """What backward holds beside the saved tensors: the gradient arriving at a step and the one it
    sends on, at the widest step."""
    rows = _rows_per_step(plan, tokens)
    widest = max(
        (n * max(s.in_width or 0, s.out_width or 0) for s, n in zip(plan.steps, rows, strict=True)),
        default=0,
    )
    return 2 * widest * dtype_bytes(dtype)


def loss_bytes(plan: Plan, tokens: int, dtype: torch.dtype) -> int:
    """A language model's cross-entropy over ``tokens`` positions (``MemoryEstimate.loss``); 0 for other
    models, whose objectives keep nothing of their own."""
    if not plan.takes_token_ids or not tokens:
        return 0
    copies = 2 + (1 if dtype_bytes(dtype) < 4 else 0)
    return tokens * plan.out_features * 4 * copies


def rank_estimate(
    plan: Plan,
    layout: ShardPlan,
    dtype: torch.dtype,
    *,
    tokens: int = 0,
    trained: int = 1,
    optimizer: str | None = None,
    seq_len: int | None = None,
    fused_attention: bool = False,
    checkpointing: str = "none",
    models: int = 1,
    one_unit: bool = False,
) -> MemoryEstimate:
    """``estimate`` for the fullest rank of a parallel ``layout``: the parameters (with their gradients
    and optimizer state) the rank holding the most keeps, and the activations of its share of the
    ``tokens`` rows (data-parallel and sequence-parallel splits; what tensor parallelism saves in
    activations is not counted, which errs safe). Under FSDP2 (``parallel.shard``) a rank keeps its
    piece of everything, plus the largest unit gathered whole while it runs, with its gradient (a block
    use; the whole model when it has no blocks, or with ``one_unit``: the TE engine shards it so).
    ``models - trained`` more models are held whole (the teacher)."""
    settings = layout.settings
    held = max((rank_elements(plan, layout, expert) for expert in range(settings.expert)), default=0)
    gathered = _largest_unit(plan, layout, one_unit) if settings.is_sharded else 0
    rows = math.ceil(tokens / settings.row_shards) if tokens else 0
    return _footprint(
        plan,
        held,
        dtype,
        rows,
        models,
        trained,
        optimizer,
        seq_len,
        fused_attention,
        checkpointing,
        gathered,
        others=parameter_count(plan),
    )


def _largest_unit(plan: Plan, layout: ShardPlan, one_unit: bool = False) -> int:
    """Parameter elements of the largest FSDP2 unit gathered on a rank: a block use, or what lies
    outside them (all of a model without blocks, or ``one_unit``); of its experts, the rank's own
    slice."""
    expert = layout.settings.expert

    def held(index: int) -> int:
        rules = layout.steps[index].params
        return sum(
            math.prod(shape) // (expert if rules[name].kind == "expert" else 1)
            for name, shape in plan.steps[index].param_shapes.items()
        )

    if one_unit:
        return sum(held(s.index) for s in plan.steps)
    inside = {i for g in plan.blocks for u in g.uses for i in u.steps}
    units = [sum(held(i) for i in u.steps) for g in plan.blocks for u in g.uses]
    units.append(sum(held(s.index) for s in plan.steps if s.index not in inside))
    return max(units)


SHARD_SIZES = (2, 4, 8, 16, 32, 64)
"""The ``parallel.shard`` sizes a refusal tries when it says what would fit."""


def what_would_fit(
    plan: Plan,
    layout: ShardPlan,
    dtype: torch.dtype,
    available: int,
    checkpointing: str = "none",
    **kwargs: Any,
) -> list[str]:
    """The settings, each on its own, under which ``rank_estimate`` fits ``available`` bytes: the
    smallest larger ``parallel.shard`` (tensor parallelism cannot be sharded), the first
    ``train.activation_checkpointing`` level that saves more than ``checkpointing``; else both."""
    from te_assembly.analysis.parallel.layout import shard_plan

    def fits(shard: int, level: str) -> bool:
        other = layout
        if shard != layout.settings.shard:
            found, _ = shard_plan(plan, dataclasses.replace(layout.settings, shard=shard))
            if found is None:
                return False
            other = found
        return rank_estimate(plan, other, dtype, checkpointing=level, **kwargs).total <= available

    settings = layout.settings
    shards = [n for n in SHARD_SIZES if n > settings.shard] if settings.tensor == 1 else []
    levels = {"none": ["blocks", "all"], "blocks": ["all"]}.get(checkpointing, [])
    out: list[str] = []
    shard = next((n for n in shards if fits(n, checkpointing)), None)
    if shard is not None:
        world = settings.world_size // settings.shard * shard
        out.append(f"parallel.shard={shard} (torchrun --nproc_per_node={world})")
    level = next((c for c in levels if fits(settings.shard, c)), None)
    if level is not None:
        out.append(f"train.activation_checkpointing={level}")
    if not out and levels:
        both = next((n for n in shards if fits(n, levels[-1])), None)
        if both is not None:
            out.append(f"parallel.shard={both} with train.activation_checkpointing={levels[-1]}")
    return out


def format_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            return f"{value:,.1f} {unit}" if unit != "B" else f"{n} B"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def _meminfo_available() -> int | None:
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def _cgroup_available() -> int | None:
    """Room left under a cgroup v2 memory limit (containers), if there is one."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit == "max":
            return None
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
    except (OSError, ValueError):
        return None
    return max(0, int(limit) - used)


def available_bytes(device: torch.device) -> tuple[int, str] | None:
    """Free memory on ``device`` and where the number comes from; None when it cannot be known.
    ``TE_ASSEMBLY_MEMORY_LIMIT`` (bytes, or with a unit: ``parse_size``) caps it, e.g. to keep to a
    share of a busy machine; a value that is not a size raises ``ResourceError``."""
    found: list[tuple[int, str]] = []
    if device.type == "cuda":
        if torch.cuda.is_available():
            free, _ = torch.cuda.mem_get_info(device)
            found.append((int(free), f"free on {device} (torch.cuda.mem_get_info)"))
    else:
        meminfo = _meminfo_available()
        if meminfo is not None:
            found.append((meminfo, "MemAvailable in /proc/meminfo"))
        cgroup = _cgroup_available()
        if cgroup is not None:
            found.append((cgroup, "left under the cgroup memory limit"))
        if not found:
            try:
                import psutil  # type: ignore[import-untyped]

                found.append((int(psutil.virtual_memory().available), "available RAM (psutil)"))
            except ImportError:
                pass
    limit = _environment_limit()
    if limit is not None:
        found.append((limit, "TE_ASSEMBLY_MEMORY_LIMIT"))
    return min(found) if found else None


def check_fits(
    needed: MemoryEstimate,
    device: torch.device,
    what: str,
    hint: str,
    available: tuple[int, str] | None = None,
) -> None:
    """Raise ``ResourceError`` when ``needed`` is more than ``device`` has free (unknown: no check)."""
    have = available if available is not None else available_bytes(device)
    if have is None or needed.total <= have[0]:
        return
    raise ResourceError(
        f"{what} needs about {format_bytes(needed.total)} of {device.type} memory ({needed.describe()}), "
        f"but only {format_bytes(have[0])} is available ({have[1]}); {hint}. Nothing was allocated."
    )


_SIZE = re.compile(r"(\d+(?:\.\d*)?(?:[eE]\d+)?)\s*([A-Za-z]*)")
_UNITS = {"": 1, "b": 1} | {
    f"{prefix}{suffix}": base**power
    for power, prefix in enumerate("kmgtp", start=1)
    for suffix, base in (("b", 1000), ("ib", 1024), ("i", 1024))
}


def parse_size(text: str, what: str) -> int:
    """Bytes from ``text``: a number of bytes (``2000000000``, ``2e9``) or one with a unit, decimal
    (``KB``, ``MB``, ``GB``...) or binary (``KiB``, ``MiB``, ``GiB``...; ``Gi`` as Kubernetes writes
    it), any case. A bare ``G`` is refused: it means 10^9 to some tools and 2^30 to others."""
    match = _SIZE.fullmatch(text.strip())
    if match is not None and match.group(2).lower() in _UNITS:
        number, unit = match.groups()
        return int(float(number) * _UNITS[unit.lower()])
    if match is not None and len(match.group(2)) == 1 and match.group(2).lower() in "kmgtp":
        number, letter = match.group(1), match.group(2).upper()
        raise ResourceError(
            f"{what}={text!r}: {letter!r} alone is ambiguous (a power of 1000 or of 1024): write "
            f"{number}{letter}B or {number}{letter}iB"
        )
    raise ResourceError(
        f"{what}={text!r} is not a size: give bytes (2000000000) or a number with a unit, decimal "
        "(500MB, 2GB) or binary (512MiB, 2GiB)"
    )


def _environment_limit() -> int | None:
    raw = os.environ.get("TE_ASSEMBLY_MEMORY_LIMIT", "").strip()
    return parse_size(raw, "TE_ASSEMBLY_MEMORY_LIMIT") if raw else None


__all__ = [
    "MemoryEstimate",
    "activation_bytes",
    "attention_elements",
    "available_bytes",
    "check_fits",
    "estimate",
    "format_bytes",
    "fused_attention",
    "loss_bytes",
    "parameter_count",
    "rank_estimate",
    "step_activation_bytes",
    "what_would_fit",
]
