"""Synthetic inputs for a plan: the main tensor ``x`` and a plausible sample for every public input slot.

Used by the main job (``run``) and benchmarks. Samples are drawn on the CPU from a seeded generator,
then moved, so the same seed gives the same data on every device.
"""

from __future__ import annotations

import torch

from te_assembly.analysis.plan import Plan, PlannedStep, PublicTensor


def rows_per_step(plan: Plan, tokens: int) -> dict[int, int]:
    """Rows of the main tensor arriving at each step (by step index). Only the MoE permutation ops
    change the row count: Dispatch copies each token top_k times, Combine sums them back. Behind a
    Dispatch with ``align > 1`` this counts the real rows; the padding varies with the routing."""
    rows: dict[int, int] = {}
    current = tokens
    for step in plan.steps:
        rows[step.index] = current
        delta = getattr(step.spec, "rows_delta", 0)
        if delta:
            top_k = int(step.args.get("top_k", 1))
            current = current * top_k if delta > 0 else current // top_k
    return rows


DEFAULT_SEQ_LEN = 32
"""Positions per sequence of synthetic ``x`` for a model that takes ``[batch, seq, features]``
(``run.seq_len``, ``train.seq_len`` and ``bench.seq_len`` default to it)."""


def x_lead(plan: Plan, tokens: int, seq_len: int = DEFAULT_SEQ_LEN) -> tuple[int, ...]:
    """``x``'s leading dimensions for ``tokens`` rows: ``(tokens // seq_len, seq_len)`` for a model whose
    ``input_layout`` is ``sequence`` (``ValueError`` unless ``seq_len`` divides ``tokens``), else
    ``(tokens,)``."""
    if not plan.takes_sequences:
        return (tokens,)
    if seq_len < 1 or tokens % seq_len:
        raise ValueError(
            f"{plan.name} takes x as [batch, seq, features]: {tokens} tokens are not whole sequences of "
            f"{seq_len} positions (use a multiple of {seq_len} tokens)"
        )
    return (tokens // seq_len, seq_len)


def sample_x(
    plan: Plan,
    tokens: int,
    *,
    generator: torch.Generator,
    device: torch.device,
    dtype: torch.dtype,
    seq_len: int = DEFAULT_SEQ_LEN,
) -> torch.Tensor:
    """``tokens`` rows of normal noise, shaped as the plan's ``input_layout`` says (``x_lead``); for a
    language model, uniformly random token ids ``[batch, seq]`` (int64) below its vocabulary."""
    if plan.takes_token_ids:
        lead = x_lead(plan, tokens, seq_len)
        return torch.randint(0, plan.in_features, lead, generator=generator).to(device=device)
    shape = (*x_lead(plan, tokens, seq_len), plan.in_features)
    return torch.randn(shape, generator=generator).to(device=device, dtype=dtype)


def sample_public_inputs(
    plan: Plan,
    tokens: int,
    *,
    generator: torch.Generator,
    device: torch.device,
    dtype: torch.dtype,
    seq_len: int = DEFAULT_SEQ_LEN,
) -> dict[str, torch.Tensor]:
    """One sample per public input, by name, in the plan's calling order.

    Float slots get float tensors of ``dtype`` (normal addends shaped like the main path there, positive
    per-row scales or probabilities); int slots get values the consuming op accepts (split sizes summing
    to the rows, expert ids, a row permutation, x's leading dimensions). Integer tensors are int64."""
    lead = x_lead(plan, tokens, seq_len)
    rows = rows_per_step(plan, tokens)
    steps = plan.steps_by_index
    padded = _behind_aligned_dispatch(plan)
    out: dict[str, torch.Tensor] = {}
    for tensor in plan.public_inputs:
        step = steps[tensor.ref.step]
        if step.index in padded:
            raise ValueError(
                f"cannot sample public input {tensor.name!r}: step {step.name!r} receives the rows of a "
                "Dispatch with align > 1, whose count depends on the routing; feed it from a channel"
            )
        value = _sample(
            step, tensor, rows[step.index], generator, lead if rows[step.index] == tokens else None
        )
        out[tensor.name] = value.to(device=device, dtype=dtype if value.is_floating_point() else torch.int64)
    return out


def _behind_aligned_dispatch(plan: Plan) -> set[int]:
    """Indices of the steps that receive rows from a Dispatch with ``align > 1`` (up to its Combine)."""
    inside, depth = set(), 0
    for step in plan.steps:
        if depth:
            inside.add(step.index)
        if step.kind == "op" and step.type == "Dispatch" and int(step.args.get("align", 1)) > 1:
            depth += 1
        elif step.kind == "op" and step.type == "Combine" and depth:
            depth -= 1
    return inside


def _sample(
    step: PlannedStep,
    tensor: PublicTensor,
    rows: int,
    generator: torch.Generator,
    lead: tuple[int, ...] | None,
) -> torch.Tensor:
    """``lead``: x's leading dimensions when the step sees all of x's rows (None after a Dispatch)."""
    slot, args = tensor.ref.slot_name, step.args
    if step.type == "RestoreTokens" and slot == "token_shape":
        return torch.tensor(lead or (rows,), dtype=torch.int64)  # back to x's layout
    if step.type in ("GroupedLinear", "GroupedLoRA") and slot == "split_sizes":
        return split_sizes(rows, int(args["num_groups"]), generator)
    if step.type == "Dispatch" and slot == "routing_map":
        top_k, experts = int(args["top_k"]), int(args["num_experts"])
        scores = torch.rand(rows, experts, generator=generator)
        return scores.topk(top_k, dim=-1).indices  # distinct experts per token, as a router picks
    if step.type == "Dispatch" and slot == "probs":
        probs = torch.rand(rows, int(args["top_k"]), generator=generator) + 0.1
        return probs / probs.sum(dim=-1, keepdim=True)
    if step.type == "Combine" and slot == "row_map":
        return torch.randperm(rows, generator=generator)
    if tensor.dtype == "int":
        raise NotImplementedError(f"no sample rule for int input {step.type}.{slot}")
    if slot == "scales":
        return torch.rand(rows, generator=generator) + 0.5  # per-row scales, like router probabilities
    # An addend shaped like the main path there: x's leading dims, or token rows after a FlattenTokens.
    main_lead = lead if lead is not None and step.layout != "tokens" else (rows,)
    width = step.slot_width(step.input_slots[tensor.ref.slot])
    return torch.randn(*main_lead, width or 1, generator=generator)


def split_sizes(rows: int, groups: int, generator: torch.Generator) -> torch.Tensor:
    """Random non-negative int64 sizes of ``groups`` groups summing to ``rows``."""
    cuts = torch.randint(0, rows + 1, (groups - 1,), generator=generator).sort().values
    bounds = torch.cat([torch.zeros(1, dtype=torch.int64), cuts, torch.tensor([rows])])
    return bounds.diff()


__all__ = ["DEFAULT_SEQ_LEN", "rows_per_step", "sample_public_inputs", "sample_x", "split_sizes", "x_lead"]
