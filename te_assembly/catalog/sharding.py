"""How each catalog op and module runs when a model is split across processes (``analysis/parallel/``,
``engines/parallel/``).

Pure data, declared once per op name and read by the parallel planner (validation, ``explain``), the
sharded engines and the checkpoint gather. An op missing here is refused by every parallel layout
that would have to split it (a test keeps this table complete).

Tensor parallelism (``parallel.tensor``) splits feature vectors between a column-parallel Linear and
the row-parallel Linear after it (Megatron's pattern, TE's ``tensor_parallel_mode``); every op in
between must work on a slice of the features. Expert parallelism (``parallel.expert``) gives each rank
a slice of the experts and moves dispatched rows to the rank that owns their expert.
"""

from __future__ import annotations

from dataclasses import dataclass

TENSOR_ROLES = ("replicated", "linear", "elementwise", "gated")
EXPERT_ROLES = ("tokens", "experts", "dispatch", "combine")


@dataclass(frozen=True)
class Sharding:
    tensor: str = "replicated"
    """``replicated``: needs whole feature vectors, so every tensor-parallel rank runs it in full (norms,
    router, MoE ops); ``linear``: split by the step's ``tensor_parallel_mode`` argument (column: its
    output features, row: its input features, as TE's ``BasicLinear``); ``elementwise``: runs as is on a
    slice of the features, and its ``split_params`` are sliced the same way; ``gated``: a GLU that halves
    the width, run on a slice whose two halves the column Linear before it interleaves."""
    split_params: tuple[tuple[str, int], ...] = ()
    """(parameter, dimension) of an elementwise op that follows the feature slice (Bias's ``bias``)."""
    split_args: tuple[str, ...] = ()
    """Constructor arguments that count those features (Bias's ``size``): divided by ``parallel.tensor``."""
    expert: str = "tokens"
    """``tokens``: runs on the rows this rank holds; ``experts``: holds the parameters of a slice of the
    groups (``group_params``); ``dispatch``: sends each dispatched row to the rank owning its expert
    (``all_to_all_single``); ``combine``: brings them back before summing each token's rows."""
    expert_count: str | None = None
    """The argument that counts experts or groups: it must be divisible by ``parallel.expert``."""
    group_params: tuple[str, ...] = ()
    """``experts``: parameter name prefixes numbered by group (``weight`` -> ``weight0`` ...)."""
    exchanged: tuple[str, ...] = ()
    """``dispatch``: row-shaped float outputs that travel with the rows (router probabilities)."""
    group_counts: str | None = None
    """``dispatch``: the rows-per-expert output; under expert parallelism it counts this rank's experts."""
    stays: tuple[str, ...] = ()
    """``dispatch``: outputs that stay with the tokens on their own rank (the row map ``Combine`` reads)."""
    whole_sequences: bool = False
    """Mixes the positions of a sequence (attention): it cannot run on rows that sequence parallelism
    splits between tensor-parallel ranks, so ``parallel.sequence`` is refused with it."""
    note: str = ""
    """Why a ``replicated`` op cannot take a slice of the features, said when a layout would give it one."""


_REPLICATED = Sharding()
_ELEMENTWISE = Sharding(tensor="elementwise")
_GATED = Sharding(tensor="gated")
_LINEAR = Sharding(tensor="linear")

SHARDING: dict[str, Sharding] = {
    # te.ops
    "Linear": _LINEAR,
    "BasicLinear": _LINEAR,
    "Bias": Sharding(tensor="elementwise", split_params=(("bias", 0),), split_args=("size",)),
    "GroupedLinear": Sharding(expert="experts", expert_count="num_groups", group_params=("weight", "bias")),
    "LayerNorm": _REPLICATED,
    "RMSNorm": _REPLICATED,
    "GELU": _ELEMENTWISE,
    "QGELU": _ELEMENTWISE,
    "ReLU": _ELEMENTWISE,
    "SReLU": _ELEMENTWISE,
    "SiLU": _ELEMENTWISE,
    "SwiGLU": _GATED,
    "GEGLU": _GATED,
    "QGEGLU": _GATED,
    "ReGLU": _GATED,
    "SReGLU": _GATED,
    "ScaledSwiGLU": _GATED,
    "ClampedSwiGLU": _GATED,
    "ScaledClampedQGeGLU": _GATED,
    "Softcap": _ELEMENTWISE,
    "MakeExtraOutput": _ELEMENTWISE,
    "AddExtraInput": _ELEMENTWISE,
    "ConstantScale": _ELEMENTWISE,
    "Identity": _ELEMENTWISE,
    "Dropout": _ELEMENTWISE,
    # ours
    "TopKRouter": Sharding(expert_count="num_experts"),
    "Dispatch": Sharding(
        expert="dispatch",
        expert_count="num_experts",
        exchanged=("row_probs",),
        group_counts="split_sizes",
        stays=("row_map",),
    ),
    "Combine": Sharding(expert="combine"),
    # Token views reshape the leading dims only: a slice of the features passes through unchanged.
    "FlattenTokens": _ELEMENTWISE,
    "RestoreTokens": _ELEMENTWISE,
    "SwapExtraInput": _ELEMENTWISE,
    # Multi-token prediction: a shift along each sequence (whole sequences on every rank; sequence
    # parallelism is refused with attention) and a swap of the main path, feature by feature.
    "ShiftTokens": _ELEMENTWISE,
    "AheadLogits": _ELEMENTWISE,
    "ConcatExtraInput": Sharding(
        note="it packs whole vectors side by side: a slice of each would interleave them"
    ),
    "SigmoidGate": Sharding(
        note="its gate is a dot product over all of gate_input's features: it runs on whole vectors"
    ),
    # An adapter reads whole input vectors and adds to whole output vectors: it runs where its projection
    # runs whole; beside experts, each rank holds its own experts' adapters.
    "LoRA": Sharding(
        note="a LoRA adapter reads the whole input of its projection: adapt Linears without "
        "tensor_parallel_mode (leave them out of lora.targets, or the layout unsplit)"
    ),
    "GroupedLoRA": Sharding(
        expert="experts",
        expert_count="num_groups",
        group_params=tuple(f"lora_{m}{i}_" for i in range(3) for m in "AB"),
    ),
}

MODULE_SHARDING: dict[str, Sharding] = {
    "Identity": _ELEMENTWISE,
    "Dropout": _ELEMENTWISE,
    "GELU": _ELEMENTWISE,
    "ReLU": _ELEMENTWISE,
    "SiLU": _ELEMENTWISE,
    "Tanh": _ELEMENTWISE,
    "Linear": _REPLICATED,
    "LayerNorm": _REPLICATED,
    # One row per token id: the ids are not features, so every tensor-parallel rank embeds them whole.
    "Embedding": _REPLICATED,
    # Attention needs whole heads in te_assembly's packed q | k | v layout, which a column-parallel QKV
    # Linear would cut across heads: it runs whole on every tensor-parallel rank, outside any region
    # (its QKV and output Linears stay unsplit), on whole sequences.
    "Attention": Sharding(
        tensor="replicated",
        whole_sequences=True,
        note="te_assembly does not split attention by heads yet: keep its QKV and output Linears without "
        "tensor_parallel_mode (attention then runs whole on every tensor-parallel rank)",
    ),
    "LatentAttention": Sharding(
        tensor="replicated",
        whole_sequences=True,
        note="latent attention expands one latent to every head: it runs whole on every tensor-parallel "
        "rank (keep its projections without tensor_parallel_mode)",
    ),
}


def sharding_of(kind: str, name: str) -> Sharding | None:
    """The entry for an op (``kind == "op"``) or an allowlisted module; None when undeclared."""
    return (SHARDING if kind == "op" else MODULE_SHARDING).get(name)


__all__ = ["EXPERT_ROLES", "MODULE_SHARDING", "SHARDING", "TENSOR_ROLES", "Sharding", "sharding_of"]
