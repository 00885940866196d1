"""What a step costs, declared beside its op in the catalog: the forward's GEMM FLOPs and what it keeps
for backward beyond its outputs. ``bench`` (FLOPs) and the memory estimate read these and nothing else,
so an op or module that is added declares its own costs or costs nothing, never a branch elsewhere.

FLOPs count matrix multiplies only, as ``torch.utils.flop_counter.FlopCounterMode`` does: 2 * rows * in
* out per linear; attention's two batched GEMMs, q k^T and p v, per head per (query, key) pair it
computes: every pair, or those a causal mask and a sliding window leave (FlashAttention's convention),
unless ``Work.every_pair`` asks for all of them (SDPA's math backend multiplies masked pairs too).
Pure data: importing this never imports torch or TE.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Args = Mapping[str, Any]


@dataclass(frozen=True)
class Work:
    """Where a step runs: the rows of the main tensor arriving, in sequences of ``seq_len``."""

    rows: int
    seq_len: int
    every_pair: bool = False
    """Count the (query, key) pairs a mask hides too (the math backend multiplies them)."""
    fused: bool = False
    """Attention runs in a fused kernel, which keeps one log-sum-exp per row and head for backward
    instead of the probabilities."""

    @property
    def sequences(self) -> int:
        return self.rows // self.seq_len if self.seq_len else 0

    def pairs(self, causal: bool = True, window: int | None = None) -> int:
        """(query, key) pairs attention computes over all sequences: each position sees itself and the
        ``window - 1`` before it (every earlier one without a window), or every position when not
        causal."""
        s = self.seq_len
        if self.every_pair or not causal:
            per_sequence = s * s
        elif window is None or window >= s:
            per_sequence = s * (s + 1) // 2
        else:
            per_sequence = window * (window + 1) // 2 + (s - window) * window
        return self.sequences * per_sequence


def _none(args: Args, work: Work) -> int:
    return 0


@dataclass(frozen=True)
class Cost:
    """A step's forward FLOPs, and what it keeps for backward: its main input (``keeps_input``) and
    ``saved`` elements more (in its compute dtype: at least float32), for ``args`` (defaults filled in)
    on ``work``. Its extra outputs are counted as kept by whoever reads them."""

    flops: Callable[[Args, Work], int] = _none
    saved: Callable[[Args, Work], int] = _none
    keeps_input: bool = True
    """Its backward needs the main-path tensor it took (a linear's weight gradient, a norm's, an
    activation's derivative); false for ops that only add, scale or move it."""
    note: str = ""
    """What the FLOPs count, in words (``ls op``, the docs); empty: no GEMM."""

    def describe(self) -> str:
        flops = f"forward FLOPs {self.note}" if self.note else "no GEMM"
        if not self.keeps_input:
            return f"{flops}; keeps nothing it took for backward"
        more = " and more it computes" if self.saved is not _none else ""
        return f"{flops}; keeps its input{more} for backward"


FREE = Cost()
"""No GEMM; keeps its input for backward (norms, activations, the router's gates)."""
MOVES = Cost(keeps_input=False)
"""Adds, scales, copies or reshapes the main path: no GEMM, and its backward needs nothing it took."""


def linear(in_arg: str = "in_features", out_arg: str = "out_features") -> Cost:
    """A projection: every row through one ``[out, in]`` weight (a grouped one: each row through its
    group's)."""
    return Cost(
        flops=lambda a, w: 2 * w.rows * int(a[in_arg]) * int(a[out_arg]),
        note=f"2 * rows * {in_arg} * {out_arg}",
    )


def per_row_weights(shapes: Callable[[Args], Mapping[str, tuple[int, ...]]], groups_arg: str | None) -> Cost:
    """Every row through all of ``shapes``' matrices in turn (LoRA's A then B), of one group when
    ``groups_arg`` names how many groups share the rows."""

    def flops(args: Args, work: Work) -> int:
        weights = sum(rows * cols for rows, cols in shapes(args).values())
        return 2 * work.rows * weights // (int(args[groups_arg]) if groups_arg else 1)

    note = "2 * rows * the elements of its matrices" + (f" (one of {groups_arg})" if groups_arg else "")
    return Cost(flops=flops, note=note)


def _attention_flops(args: Args, work: Work) -> int:
    pairs = work.pairs(bool(args.get("causal", True)), args.get("sliding_window"))
    return 2 * 2 * int(args["num_heads"]) * int(args["head_dim"]) * pairs


def _attention_saved(args: Args, work: Work) -> int:
    # q, k and v after the rotary embedding, counted as [rows, heads, head_dim] each (an upper bound
    # where key/value heads are shared); the probabilities, one per head per key of the sequence,
    # unless a fused kernel keeps a log-sum-exp instead. Sinks and soft-capping are written out (no
    # fused kernel has them): sinks keep the logits beside the probabilities, the cap its tanh too.
    heads, head_dim = int(args["num_heads"]), int(args["head_dim"])
    sinks, capped = bool(args.get("sinks")), args.get("logit_softcap") is not None
    fused = work.fused and not (sinks or capped)
    per_head = 1 if fused else work.seq_len * (1 + sinks + 2 * capped)
    return work.rows * heads * (3 * head_dim + per_head)


ATTENTION = Cost(
    flops=_attention_flops,
    saved=_attention_saved,
    note="4 * num_heads * head_dim per (query, key) pair the causal mask and sliding_window leave "
    "(q k^T and p v); sinks and soft-capping add no GEMM",
)


def _latent_flops(args: Args, work: Work) -> int:
    heads, nope, rope = int(args["num_heads"]), int(args["qk_nope_dim"]), int(args["qk_rope_dim"])
    values, rank = int(args["v_head_dim"]), int(args["kv_lora_rank"])
    expand = 2 * work.rows * rank * heads * (nope + values)
    return expand + 2 * heads * (nope + rope + values) * work.pairs(bool(args.get("causal", True)))


def _latent_saved(args: Args, work: Work) -> int:
    # the normalised latent; each head's expanded keys and values, its queries and keys with the
    # rotated part joined on (as the attention kernel takes them); the probabilities or log-sum-exp
    heads, nope, rope = int(args["num_heads"]), int(args["qk_nope_dim"]), int(args["qk_rope_dim"])
    values, rank = int(args["v_head_dim"]), int(args["kv_lora_rank"])
    per_head = 1 if work.fused else work.seq_len
    return work.rows * (rank + heads * (nope + values) + heads * 2 * (nope + rope) + heads * per_head)


LATENT_ATTENTION = Cost(
    flops=_latent_flops,
    saved=_latent_saved,
    note="2 * rows * kv_lora_rank * num_heads * (qk_nope_dim + v_head_dim) (the latent's expansion), "
    "then 2 * num_heads * (qk_nope_dim + qk_rope_dim + v_head_dim) per causal (query, key) pair",
)


__all__ = ["ATTENTION", "FREE", "LATENT_ATTENTION", "MOVES", "Cost", "Work", "linear", "per_row_weights"]
