"""Catalog entries for the token views: how ops that move rows (Dispatch, Combine) see a ``[batch, seq,
features]`` main path. TE's own ``Reshape`` op needs a fixed shape, which cannot give back a batch and
sequence length known only at call time; these carry the leading dimensions on a channel instead."""

from __future__ import annotations

from te_assembly.catalog.costs import MOVES
from te_assembly.catalog.spec import OpSpec, Slot

_REF = "te_assembly.engines.reference.ops.tokens"

TOKEN_OPS: tuple[OpSpec, ...] = (
    OpSpec(
        name="FlattenTokens",
        doc="[..., features] -> [tokens, features]; the leading dimensions leave on token_shape.",
        outputs=(
            Slot(
                "token_shape",
                "int",
                shape="token_shape",
                doc="int64 [ndim - 1]: the leading dimensions of the tensor it flattened.",
            ),
        ),
        sets_layout="tokens",
        reference=f"{_REF}:FlattenTokens",
        te_runs_on_cpu=True,
        cost=MOVES,
    ),
    OpSpec(
        name="RestoreTokens",
        doc="[tokens, features] -> [*token_shape, features]: undoes a FlattenTokens.",
        inputs=(
            Slot(
                "token_shape",
                "int",
                shape="token_shape",
                doc="A FlattenTokens' token_shape (int64 leading dimensions).",
            ),
        ),
        needs_layout="tokens",
        sets_layout="token_shape",
        reference=f"{_REF}:RestoreTokens",
        te_runs_on_cpu=True,
        cost=MOVES,
    ),
)
