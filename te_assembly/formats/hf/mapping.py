"""A te_assembly plan as a Hugging Face family: the ``config.json`` of its spec, and the rules that say
where each of its tensors lives in a checkpoint (``names.py``), under the plan's own step names. What
import, export and the PEFT adapter format (``formats/adapters.py``) all map through."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from te_assembly.formats.hf.config import KEPT_FIELDS, HFSpec, parse_config
from te_assembly.formats.hf.families import FAMILIES
from te_assembly.formats.hf.layout import (
    UnexportableError,
    check_same_steps,
    families_of,
    model_config,
    spec_of_plan,
)
from te_assembly.formats.hf.names import Rule, chosen_layout, renamed
from te_assembly.formats.hf.rope import scaling_of
from te_assembly.formats.hf.tensors import rules

if TYPE_CHECKING:
    from te_assembly.analysis.plan import Plan


def hf_config(spec: HFSpec, dtype: str) -> dict[str, Any]:
    """The ``config.json`` of ``spec``: the fields every family writes, then the family's own
    (``Family.config``), each one ``config.py`` reads back."""
    family = FAMILIES[spec.architecture]
    # The family and the dtype are the model's own now; the rest of the import's metadata is kept.
    written = {"architectures", "model_type", "dtype", "torch_dtype"}
    keep = {k: v for k, v in spec.metadata.items() if k in KEPT_FIELDS and k not in written}
    out: dict[str, Any] = {
        "architectures": [family.architecture],
        "model_type": family.model_type,
        "vocab_size": spec.vocab,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.ffn,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": spec.eps,
        "tie_word_embeddings": spec.tied,
        "attention_dropout": 0.0,
        "initializer_range": spec.init_std,
        "max_position_embeddings": keep.pop("max_position_embeddings", 4096),
        "rope_theta": spec.rope["rope_theta"],
        "rope_scaling": scaling_of(spec.rope),
        # The embedding's padding row (``layout._padding``), said even when there is none: some families'
        # configs default to one (Phi-3's 32000, OLMo 2's 1) that transformers would give no gradient.
        "pad_token_id": spec.metadata.get("pad_token_id"),
        "dtype": dtype,
        **keep,
    }
    out.update(family.config(spec))
    return out


def mapping_of_plan(
    plan: Plan, metadata: Mapping[str, Any] | None = None, available: Collection[str] | None = None
) -> tuple[HFSpec, list[Rule]]:
    """The spec ``plan`` expresses and its rules under its own step names: the first family (the
    imported one first) whose model, written out and rebuilt, has ``plan``'s very steps
    (``UnexportableError``, the first family's reason, for a plan no family expresses: one with adapters
    among them; ``formats/adapters.py`` maps those). ``available``: the Hugging Face tensor names at
    hand (a state dict being mapped back): a family whose names they are not is passed over while
    another fits (a Llama-shaped Phi-3 is Phi-3 for Phi-3's tensors)."""
    from te_assembly.analysis.pipeline import load

    refused: UnexportableError | None = None
    fitting: tuple[HFSpec, list[Rule]] | None = None
    for family in families_of(plan, metadata):
        read = spec_of_plan(plan, family, metadata)
        # Through config.json and back: what the family cannot say (a Mistral's q/k/v biases) is
        # dropped here, so the comparison below names the step instead of an export that loses it.
        spec = parse_config(hf_config(read, "float32"), Path("config.json"))
        rebuilt = load(model_config(spec, plan.name)).checked_plan()
        try:
            names = check_same_steps(plan, rebuilt, spec.architecture)
        except UnexportableError as exc:
            refused = refused or exc  # the first family's reason, the likeliest one
            continue
        found = (spec, renamed(rules(spec), names))
        if available is None or all(chosen_layout(r, available) is not None for r in found[1]):
            return found
        fitting = fitting or found
    if fitting is not None:
        return fitting
    assert refused is not None  # families_of names at least one family or refuses
    raise refused


def rules_of_plan(plan: Plan) -> list[Rule]:
    """Every tensor of ``plan`` (a model no adapters are part of) with where a Hugging Face checkpoint
    keeps it."""
    return mapping_of_plan(plan)[1]


__all__ = ["hf_config", "mapping_of_plan", "rules_of_plan"]
