"""Every tensor of the te_assembly model of a ``HFSpec``, with where a Hugging Face checkpoint keeps it:
the embedding, the norms and the head alike for every family, each layer's attention and MLP as its
family says (``families/``), and the multi-token prediction modules after the layers."""

from __future__ import annotations

from te_assembly.formats.hf.families import FAMILIES
from te_assembly.formats.hf.families.base import one
from te_assembly.formats.hf.names import Part, Rule
from te_assembly.formats.hf.spec import HFSpec


def rules(spec: HFSpec) -> list[Rule]:
    """Every tensor of the te_assembly model of ``spec`` (canonical step names, as ``layout.model_config``
    writes them), with where it lives in the checkpoint: the embedding, the norms and the head here,
    each layer's attention and MLP as its family says (``families/``)."""
    family = FAMILIES[spec.architecture]
    modules = [f"model.layers.{spec.layers + k}." for k in range(spec.mtp_modules)]
    # each MTP module's embed_tokens and shared_head.head: copies of the model's (DeepSeek-V3 shares them)
    embeds = tuple(f"{hf}embed_tokens.weight" for hf in modules)
    heads = tuple(f"{hf}shared_head.head.weight" for hf in modules)
    embed_copies = embeds + (heads if spec.tied else ())
    out = [Rule("steps.embed.weight", ((Part("model.embed_tokens.weight", spec.vocab),),), embed_copies)]
    for n in range(spec.layers):
        # The first layers may be dense (GLM-4.5's first_k_dense_replace): steps of dense_layers, the
        # rest of layers counted after them
        dense = n < spec.first_dense
        te = f"steps.dense_layers.{n}." if dense else f"steps.layers.{n - spec.first_dense}."
        hf = f"model.layers.{n}."
        out.extend(family.layer_rules(spec, te, hf, dense))
    for k, hf in enumerate(modules, start=1):
        out.extend(
            (
                one(f"steps.mtp{k}_hnorm.weight", f"{hf}hnorm.weight", spec.hidden),
                one(f"steps.mtp{k}_enorm.weight", f"{hf}enorm.weight", spec.hidden),
                one(f"steps.mtp{k}_proj.basic_ops.0.weight", f"{hf}eh_proj.weight", spec.hidden),
            )
        )
        out.extend(family.layer_rules(spec, f"steps.mtp{k}.0.", hf, dense=False))
        out.append(one(f"steps.mtp{k}_norm.weight", f"{hf}shared_head.norm.weight", spec.hidden))
    out.append(one("steps.final_norm.weight", "model.norm.weight", spec.hidden))
    if not spec.tied:
        out.append(Rule("steps.head.basic_ops.0.weight", ((Part("lm_head.weight", spec.vocab),),), heads))
    return out


__all__ = ["rules"]
