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
from dataclasses import dataclass
from typing import Any

import torch

from te_assembly.analysis.parallel.layout import ShardPlan, rank_elements
from te_assembly.analysis.plan import Plan, PlannedStep
from te_assembly.catalog.costs import Work
from te_assembly.engines.data import rows_per_step
from te_assembly.engines.free_memory import available_bytes, format_bytes, parse_size
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
    chunk_tokens: int | None = None,
) -> int:
    """What one forward keeps for backward: ``x``, what each step keeps (``step_activation_bytes``) and
    the output (sequences of ``seq_len`` rows; default: one sequence of all ``tokens``; ``fused``: see
    ``attention_elements``). ``chunk_tokens`` (``train.loss_chunk_tokens``): a language model's head runs
    that many tokens at a time (``engines/head_chunks.py``): it keeps its input and, while a chunk
    runs, that chunk's share of what it would keep; its output is a number or two per token.

    ``checkpointing`` (``train.activation_checkpointing``): a recomputed unit keeps only its input
    between forward and backward, and in backward the largest one holds all it would have kept while
    it is recomputed. ``blocks``: each block use (a model without blocks: the whole forward); ``all``:
    each step."""
    size = dtype_bytes(dtype)
    per_step = step_activation_bytes(plan, tokens, dtype, seq_len, fused)
    rows = _rows_per_step(plan, tokens)
    total = _input_bytes(plan, tokens, size) + tokens * plan.out_features * size
    head = plan.head if chunk_tokens is not None and tokens else None
    if head is not None:
        assert chunk_tokens is not None
        share = min(1.0, chunk_tokens / tokens)
        total += rows[head] * (plan.steps[head].in_width or 0) * size - tokens * plan.out_features * size
        total += math.ceil(sum(per_step[head:]) * share)
        per_step = per_step[:head] + [0] * (len(per_step) - head)
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
    chunk_tokens: int | None = None,
) -> MemoryEstimate:
    """``models`` copies of the parameters (e.g. teacher and student), ``trained`` of them with
    gradients and ``optimizer`` state, and the activations of one forward+backward of ``tokens`` rows
    (in sequences of ``seq_len`` for attention; default: one sequence; ``fused_attention``: TE's fused
    attention kernels, see ``attention_elements``; ``checkpointing``, ``chunk_tokens``: see
    ``activation_bytes``)."""
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
        chunk_tokens=chunk_tokens,
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
    chunk_tokens: int | None = None,
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
        activations=activation_bytes(plan, tokens, dtype, seq_len, fused, checkpointing, chunk_tokens)
        + gradient_bytes(plan, tokens, dtype, chunk_tokens)
        if tokens
        else 0,
        loss=loss_bytes(plan, tokens, dtype, chunk_tokens),
    )


def gradient_bytes(plan: Plan, tokens: int, dtype: torch.dtype, chunk_tokens: int | None = None) -> int:
    """What backward holds beside the saved tensors: the gradient arriving at a step and the one it
    sends on, at the widest step (a language model's head over one chunk of ``chunk_tokens``)."""
    rows = _rows_per_step(plan, tokens)
    head = plan.head if chunk_tokens is not None else None
    if head is not None:
        assert chunk_tokens is not None
        rows = rows[:head] + [min(n, chunk_tokens) for n in rows[head:]]
    widest = max((n * _gradient_width(s) for s, n in zip(plan.steps, rows, strict=True)), default=0)
    return 2 * widest * dtype_bytes(dtype)


def _gradient_width(step: PlannedStep) -> int:
    # An embedding's in_width is its vocabulary: it takes token ids, which get no gradient.
    arriving = 0 if step.spec.needs_layout == "token_ids" else step.in_width or 0
    return max(arriving, step.out_width or 0)


def loss_bytes(plan: Plan, tokens: int, dtype: torch.dtype, chunk_tokens: int | None = None) -> int:
    """A language model's cross-entropy over ``tokens`` positions (``MemoryEstimate.loss``), over one
    chunk of ``chunk_tokens`` at a time when its head runs in chunks; 0 for other models, whose
    objectives keep nothing of their own."""
    if not plan.takes_token_ids or not tokens:
        return 0
    copies = 2 + (1 if dtype_bytes(dtype) < 4 else 0)
    if chunk_tokens is not None and plan.head is not None:
        tokens = min(tokens, chunk_tokens)
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
    chunk_tokens: int | None = None,
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
        chunk_tokens=chunk_tokens,
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
    "parse_size",
    "rank_estimate",
    "step_activation_bytes",
    "what_would_fit",
]
