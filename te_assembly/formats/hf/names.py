"""Every tensor's name and layout in te_assembly and in a Hugging Face checkpoint, both ways.

A ``Rule`` says how one te_assembly tensor is made of Hugging Face tensors: the ``Part``s stacked along
dim 0 (``qkv`` = q_proj | k_proj | v_proj rows; an expert's ``fc1`` = gate | up rows), each part a
whole tensor or one expert's slice of a stacked one. A rule may list alternatives: the Hub's own layout
first (what export writes, e.g. Mixtral's ``block_sparse_moe.experts.N.w1``), then the layouts other
versions of ``transformers`` keep in memory or save (``mlp.experts.gate_up_proj`` ``[experts, 2 * ffn,
hidden]``). Import takes the first alternative whose tensors all exist.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Part:
    """``rows`` rows of a te_assembly tensor: Hugging Face tensor ``name``, or its ``index``-th slice
    along dim 0 (one expert of a stacked tensor); ``transposed``: that tensor (or slice) holds them as
    columns (GPT-OSS's experts, ``[hidden, 2 * ffn]``); ``stride``/``offset``: every ``stride``-th row
    from ``offset`` (GPT-OSS's gate and up rows, interleaved)."""

    name: str
    rows: int
    index: int | None = None
    transposed: bool = False
    stride: int = 1
    offset: int = 0

    def stored_shape(self, rest: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of the tensor (or slice) the part is read from, given the te_assembly tensor's
        trailing dims ``rest``."""
        rows = (self.rows * self.stride, *rest)
        return tuple(reversed(rows)) if self.transposed else rows

    def take(self, stored: torch.Tensor) -> torch.Tensor:
        """The part's rows of the tensor (or slice) it is read from."""
        t = stored.T if self.transposed else stored
        return t[self.offset :: self.stride] if self.stride > 1 else t


@dataclass(frozen=True)
class Rule:
    """te_assembly tensor ``te`` = its parts stacked along dim 0, in one of the ``layouts``."""

    te: str
    layouts: tuple[tuple[Part, ...], ...]
    copies: tuple[str, ...] = ()
    """Other Hugging Face tensors that hold the same whole tensor (an MTP module's ``embed_tokens`` and
    ``shared_head.head``, which DeepSeek-V3 shares with the model's): export writes each, import holds
    each it finds equal to the one it reads."""

    @property
    def hub(self) -> tuple[Part, ...]:
        return self.layouts[0]


def renamed(rule_list: list[Rule], names: Mapping[str, str]) -> list[Rule]:
    """``rule_list`` with te_assembly step names translated (canonical step -> the model's own)."""
    out = []
    for rule in rule_list:
        step, param = _split_step(rule.te.removeprefix("steps."), names)
        out.append(Rule(f"steps.{names.get(step, step)}.{param}", rule.layouts, rule.copies))
    return out


def _split_step(name: str, names: Mapping[str, str]) -> tuple[str, str]:
    """``layers.0.qkv.basic_ops.0.weight`` -> (``layers.0.qkv``, ``basic_ops.0.weight``): the longest
    known step name that prefixes it."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        step = ".".join(parts[:cut])
        if step in names:
            return step, ".".join(parts[cut:])
    raise KeyError(f"no step of the model holds {name}")


def hub_tensors(rule_list: list[Rule], tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """te_assembly-named ``tensors`` (a state dict, gradients...) as the Hub names and lays them out.
    Tensors no rule names are left out; a rule whose tensor is missing is skipped."""
    import torch  # the names alone (what validation and the families read) need none

    out: dict[str, torch.Tensor] = {}
    stacked: dict[str, dict[int, torch.Tensor]] = {}
    # The pieces of each stored tensor (or expert slice), by offset: one, or a part's interleaved rows
    pieces_of: dict[tuple[str, int | None], dict[int, tuple[Part, torch.Tensor]]] = {}
    for rule in rule_list:
        if rule.te not in tensors:
            continue
        pieces = torch.split(tensors[rule.te], [p.rows for p in rule.hub], dim=0)
        for part, piece in zip(rule.hub, pieces, strict=True):
            pieces_of.setdefault((part.name, part.index), {})[part.offset] = (part, piece)
    for (name, index), by_offset in pieces_of.items():
        parts = [by_offset[o] for o in sorted(by_offset)]
        rows = parts[0][1] if len(parts) == 1 else torch.stack([p for _, p in parts], dim=1).flatten(0, 1)
        stored = (rows.T if parts[0][0].transposed else rows).contiguous()  # r0 o0, r0 o1, r1 o0...
        if index is None:
            out[name] = stored
        else:
            stacked.setdefault(name, {})[index] = stored
    for name, by_index in stacked.items():
        out[name] = torch.stack([by_index[i] for i in sorted(by_index)])
    for rule in rule_list:
        if rule.copies and rule.te in tensors:
            # a copy of its own: safetensors writes no two names over one storage
            out.update({copy: out[rule.hub[0].name].clone() for copy in rule.copies})
    return out


def gather(layout: tuple[Part, ...], source: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The te_assembly tensor ``layout``'s parts make, each read from ``source`` (stacked by rows)."""
    import torch

    pieces = [p.take(source[p.name] if p.index is None else source[p.name][p.index]) for p in layout]
    return pieces[0].contiguous() if len(pieces) == 1 else torch.cat(pieces, dim=0)


def chosen_layout(rule: Rule, available: Collection[str]) -> tuple[Part, ...] | None:
    """The first of the rule's layouts whose tensors all exist, or None."""
    for layout in rule.layouts:
        if all(p.name in available for p in layout):
            return layout
    return None
