"""Catalog entries for multi-token prediction (DeepSeek-V3's MTP modules, GLM-4.5's): a module reads the
main model's hidden states beside the embeddings of the tokens one further on (``ShiftTokens``), runs a
decoder layer of its own and a vocabulary head, and hands its logits to the caller
(``AheadLogits``), which adds their cross-entropy against the token ``depth`` past the next to its
objective (``train.mtp_weight``). TE has neither op; both run as reference ops inside TE's fuser."""

from __future__ import annotations

from te_assembly.catalog.costs import MOVES
from te_assembly.catalog.spec import OpSpec, Param, Slot, Width

_REF = "te_assembly.engines.reference.ops.prediction"

PREDICTION_OPS: tuple[OpSpec, ...] = (
    OpSpec(
        name="ShiftTokens",
        doc="y[:, i] = x[:, i + by], zeros for the last by positions of each sequence: what position i "
        "holds of the token by places further on (an MTP module's embeddings of the next tokens). "
        "Causal attention after it never lets a position see the zeros' neighbours' future: a position "
        "only reads tokens up to i + by, which its own training targets lie beyond.",
        params=(Param("by", int, bounds=(1, None), doc="How many positions later each row is taken from."),),
        needs_layout="sequence",
        reference=f"{_REF}:ShiftTokens",
        te_runs_on_cpu=True,
        cost=MOVES,
    ),
    OpSpec(
        name="AheadLogits",
        doc="Ends a multi-token prediction module: the logits arriving leave on the public output "
        "logits (predicting, at position i, the token depth places past the next: i + 1 + depth) and "
        "the main path resumes with value (the hidden state kept before the module). The caller adds "
        "their cross-entropy, times train.mtp_weight divided by the number of modules, to its "
        "objective (DeepSeek-V3's MTP loss).",
        params=(
            Param("depth", int, bounds=(1, None), doc="Tokens past the next one the logits predict."),
            Param("value_features", int, doc="Width of value, and of the main path after the op."),
        ),
        inputs=(
            Slot("value", "float", width_arg="value_features", doc="The tensor the main path resumes with."),
        ),
        outputs=(
            Slot(
                "logits",
                "float",
                doc="The module's vocabulary logits (the main path arriving).",
                ahead_arg="depth",
            ),
        ),
        width=Width(out_arg="value_features"),
        reference=f"{_REF}:AheadLogits",
        te_runs_on_cpu=True,
        cost=MOVES,
    ),
)
