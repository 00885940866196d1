"""A Hugging Face checkpoint's tensors against the model of its ``config.json``: every name, shape and
dtype checked from the safetensors headers before any tensor is read (``tensor_plan``: each missing,
misshapen or unexpected tensor named at once), then each read from its memory-mapped shard into its
te_assembly name and layout (``stream``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from te_assembly.errors import CheckpointError
from te_assembly.formats.hf.names import Rule, chosen_layout, gather
from te_assembly.formats.hf.shards import HFCheckpoint
from te_assembly.formats.hf.spec import HFSpec
from te_assembly.formats.hf.tensors import rules
from te_assembly.formats.pretrained import expected_shapes
from te_assembly.formats.tensor_file import FLOAT_DTYPES

if TYPE_CHECKING:
    from te_assembly.analysis.plan import Plan

Progress = Callable[[int, int, str], None]
"""``progress(done, total, what)``: called as tensors are read or written (the CLI draws a bar)."""
INERT_TENSORS = re.compile(r"(^|\.)rotary_emb\.inv_freq$")
"""Tensors some checkpoints carry that are recomputed, never learned (old Llama's RoPE buffers)."""


def tensor_plan(spec: HFSpec, plan: Plan, checkpoint: HFCheckpoint) -> list[tuple[Rule, tuple[Any, ...]]]:
    """Each rule with the layout it reads, every shape checked first; ``CheckpointError`` lists every
    missing, misshapen or unexpected tensor (a checkpoint that disagrees with its ``config.json``)."""
    wanted = expected_shapes(plan)
    table = rules(spec)
    names = {r.te for r in table}
    if names != set(wanted):  # the mapping and the model come from one spec: a bug if they differ
        raise RuntimeError(f"te_assembly's {spec.architecture} mapping misses {sorted(set(wanted) ^ names)}")
    problems: list[str] = []
    used: set[str] = set()
    chosen: list[tuple[Rule, tuple[Any, ...]]] = []
    for rule in table:
        layout = chosen_layout(rule, checkpoint)
        if layout is None:
            missing = [p.name for p in rule.hub if p.name not in checkpoint]
            problems.append(f"missing {', '.join(missing)}")
            continue
        rest = wanted[rule.te][1:]
        for part in layout:
            used.add(part.name)
            if checkpoint.dtype(part.name) not in FLOAT_DTYPES:
                problems.append(
                    f"{part.name} holds {checkpoint.dtype(part.name)} values, not floating-point weights"
                )
            shape, rows = checkpoint.shape(part.name), part.stored_shape(tuple(rest))
            if part.index is None:
                ok, expected_text = tuple(shape) == rows, str(rows)
            else:  # one expert's slice of a stacked tensor
                ok = len(shape) == 1 + len(rows) and shape[0] > part.index and tuple(shape[1:]) == rows
                expected_text = f"[>{part.index}, {', '.join(map(str, rows))}]"
            if not ok:
                problems.append(f"{part.name} has shape {tuple(shape)}, config.json says {expected_text}")
        chosen.append((rule, layout))
    for rule, layout in chosen:
        for copy in rule.copies:
            if copy in checkpoint:
                used.add(copy)
                if checkpoint.shape(copy) != checkpoint.shape(layout[0].name):
                    problems.append(
                        f"{copy} has shape {checkpoint.shape(copy)}, a copy of {layout[0].name} "
                        f"{checkpoint.shape(layout[0].name)}"
                    )
    dropped = tuple(f"model.layers.{spec.layers + n}." for n in range(spec.dropped_layers))
    for name in sorted(set(checkpoint) - used):
        if INERT_TENSORS.search(name) or (spec.tied and name == "lm_head.weight") or name.startswith(dropped):
            continue
        problems.append(f"{name} is not part of a {spec.architecture} of this config (it would be dropped)")
    modules = f"model.layers.{spec.layers}."
    if spec.mtp_modules and any(modules in p for p in problems):
        problems.append(
            f"the {spec.mtp_modules} multi-token prediction module(s) num_nextn_predict_layers declares "
            f"({modules}...) are read whole, as DeepSeek-V3 and GLM-4.5 publish them: "
            "import_hf.ignore_fields=[num_nextn_predict_layers] imports the model without them, knowingly "
            "(as transformers leaves them out)"
        )
    if problems:
        raise CheckpointError(
            f"{checkpoint.directory} does not match its config.json: " + "; ".join(problems)
        )
    return chosen


def stream(
    chosen: list[tuple[Rule, tuple[Any, ...]]],
    checkpoint: HFCheckpoint,
    dtype: torch.dtype,
    progress: Progress | None,
) -> Iterator[tuple[str, torch.Tensor]]:
    for done, (rule, layout) in enumerate(chosen, start=1):
        tensor = gather(layout, checkpoint).to(dtype)
        if not torch.isfinite(tensor).all():
            raise CheckpointError(
                f"{checkpoint.directory}: {', '.join(p.name for p in layout)} holds NaN or inf"
            )
        for copy in (c for c in rule.copies if c in checkpoint):
            if not torch.equal(checkpoint[copy], checkpoint[layout[0].name]):
                raise CheckpointError(
                    f"{checkpoint.directory}: {copy} differs from {layout[0].name}: te_assembly holds them "
                    "as one tensor (the multi-token prediction module shares the model's embedding and "
                    "head, as DeepSeek-V3 trains it)"
                )
        yield rule.te, tensor
        if progress is not None:
            progress(done, len(chosen), rule.te)


__all__ = ["INERT_TENSORS", "Progress", "stream", "tensor_plan"]
