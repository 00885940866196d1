"""Catalog entry for soft-capping: ``cap * tanh(x / cap)`` on the main path (Gemma 2's final logits).
TE has no such op or kernel; it runs as a reference op inside TE's fuser (``engines/te/adapter.py``)."""

from __future__ import annotations

from te_assembly.catalog.spec import OpSpec, Param

CAPPING_OPS: tuple[OpSpec, ...] = (
    OpSpec(
        name="Softcap",
        doc="y = cap * tanh(x / cap): squashes every value into (-cap, cap), nearly unchanged near zero "
        "(Gemma 2's final_logit_softcapping after the vocabulary head). TE has no kernel for it: both "
        "engines run the reference op.",
        params=(Param("cap", float, bounds=(1e-6, None), doc="The bound: Gemma 2's 30.0 for its logits."),),
        reference="te_assembly.engines.reference.ops.activations:Softcap",
        te_runs_on_cpu=True,
        token_wise=True,
    ),
)
