"""Every tensor of the te_assembly model of a ``HFSpec``, with where a Hugging Face checkpoint keeps it:
the embedding, the norms and the head alike for every family, each layer's attention and MLP as its
family says (``families/``)."""

from __future__ import annotations

from te_assembly.formats.hf.families import FAMILIES
from te_assembly.formats.hf.families.base import one
from te_assembly.formats.hf.names import Rule
from te_assembly.formats.hf.spec import HFSpec


def rules(spec: HFSpec) -> list[Rule]:
    """Every tensor of the te_assembly model of ``spec`` (canonical step names, as ``layout.model_config``
    writes them), with where it lives in the checkpoint: the embedding, the norms and the head here,
    each layer's attention and MLP as its family says (``families/``)."""
    family = FAMILIES[spec.architecture]
    out = [one("steps.embed.weight", "model.embed_tokens.weight", spec.vocab)]
    for n in range(spec.layers):
        # The first layers may be dense (GLM-4.5's first_k_dense_replace): steps of dense_layers, the
        # rest of layers counted after them
        dense = n < spec.first_dense
        te = f"steps.dense_layers.{n}." if dense else f"steps.layers.{n - spec.first_dense}."
        hf = f"model.layers.{n}."
        out.extend(family.layer_rules(spec, te, hf, dense))
    out.append(one("steps.final_norm.weight", "model.norm.weight", spec.hidden))
    if not spec.tied:
        out.append(one("steps.head.basic_ops.0.weight", "lm_head.weight", spec.vocab))
    return out


__all__ = ["rules"]
