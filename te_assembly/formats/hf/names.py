"""Every tensor's name and layout in te_assembly and in a Hugging Face checkpoint, both ways.

A ``Rule`` says how one te_assembly tensor is made of Hugging Face tensors: the ``Part``s stacked along
dim 0 (``qkv`` = q_proj | k_proj | v_proj rows; an expert's ``fc1`` = gate | up rows), each part a
whole tensor or one expert's slice of a stacked one. A rule may list alternatives: the Hub's own layout
first (what export writes, e.g. Mixtral's ``block_sparse_moe.experts.N.w1``), then the layouts other
versions of ``transformers`` keep in memory or save (``mlp.experts.gate_up_proj`` ``[experts, 2 * ffn,
hidden]``). Import takes the first alternative whose tensors all exist.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

from te_assembly.formats.hf.config import HFSpec


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

    @property
    def hub(self) -> tuple[Part, ...]:
        return self.layouts[0]


def _one(te: str, hf: str, rows: int) -> Rule:
    return Rule(te, ((Part(hf, rows),),))


def rules(spec: HFSpec) -> list[Rule]:
    """Every tensor of the te_assembly model of ``spec`` (canonical step names, as ``layout.model_config``
    writes them), with where it lives in the checkpoint."""
    out = [_one("steps.embed.weight", "model.embed_tokens.weight", spec.vocab)]
    for n in range(spec.layers):
        # GLM-4.5's first layers are dense: steps of dense_layers, the rest of layers counted after them
        dense = n < spec.first_dense
        te = f"steps.dense_layers.{n}." if dense else f"steps.layers.{n - spec.first_dense}."
        hf = f"model.layers.{n}."
        attn = f"{hf}self_attn."
        out.append(_one(f"{te}attn_norm.weight", f"{hf}input_layernorm.weight", spec.hidden))
        if spec.family.attention == "mla":
            out.extend(_mla_rules(spec, te, attn))
        else:
            out.extend(_gqa_rules(spec, te, attn))
        out.append(_one(f"{te}mlp_norm.weight", f"{hf}post_attention_layernorm.weight", spec.hidden))
        out.extend(_mlp_rules(spec, te, hf, dense))
    out.append(_one("steps.final_norm.weight", "model.norm.weight", spec.hidden))
    if not spec.tied:
        out.append(_one("steps.head.basic_ops.0.weight", "lm_head.weight", spec.vocab))
    return out


def _gqa_rules(spec: HFSpec, te: str, attn: str) -> Iterator[Rule]:
    q, kv = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
    # q_proj | k_proj | v_proj stacked by rows: the packed QKV Linear (and its bias, Qwen2's).
    stacked = (("q_proj", q), ("k_proj", kv), ("v_proj", kv))
    kinds = (("basic_ops.0", "weight"), *((("basic_ops.1", "bias"),) if spec.qkv_bias else ()))
    for op, kind in kinds:
        parts = tuple(Part(f"{attn}{proj}.{kind}", rows) for proj, rows in stacked)
        yield Rule(f"{te}qkv.{op}.{kind}", (parts,))
    if spec.qk_norm:
        yield _one(f"{te}attn.q_norm_weight", f"{attn}q_norm.weight", spec.head_dim)
        yield _one(f"{te}attn.k_norm_weight", f"{attn}k_norm.weight", spec.head_dim)
    yield _one(f"{te}proj.basic_ops.0.weight", f"{attn}o_proj.weight", spec.hidden)
    if spec.o_bias:
        yield _one(f"{te}proj.basic_ops.1.bias", f"{attn}o_proj.bias", spec.hidden)
    if spec.family.mlp == "gpt_oss":
        yield _one(f"{te}attn.sinks", f"{attn}sinks", spec.heads)


def _mla_rules(spec: HFSpec, te: str, attn: str) -> Iterator[Rule]:
    """DeepSeek-V3's latent attention: each projection and norm its own step, the latent's norm and
    expansion the attention step's parameters."""
    mla, bias = spec.mla, spec.mla["attention_bias"]
    q_rows = spec.heads * (mla["qk_nope_dim"] + mla["qk_rope_dim"])
    projections = (
        ("kv_a", "kv_a_proj_with_mqa", mla["kv_lora_rank"] + mla["qk_rope_dim"], bias),
        ("q_a", "q_a_proj", mla["q_lora_rank"], bias),
        ("q_b", "q_b_proj", q_rows, False),
        ("proj", "o_proj", spec.hidden, bias),
    )
    for step, hf, rows, has_bias in projections:
        yield _one(f"{te}{step}.basic_ops.0.weight", f"{attn}{hf}.weight", rows)
        if has_bias:
            yield _one(f"{te}{step}.basic_ops.1.bias", f"{attn}{hf}.bias", rows)
    yield _one(f"{te}q_norm.weight", f"{attn}q_a_layernorm.weight", mla["q_lora_rank"])
    yield _one(f"{te}attn.kv_norm_weight", f"{attn}kv_a_layernorm.weight", mla["kv_lora_rank"])
    kv_rows = spec.heads * (mla["qk_nope_dim"] + mla["v_head_dim"])
    yield _one(f"{te}attn.kv_b_weight", f"{attn}kv_b_proj.weight", kv_rows)


def _mlp_rules(spec: HFSpec, te: str, hf: str, dense: bool = False) -> Iterator[Rule]:
    ffn = spec.dense_ffn if dense else spec.ffn
    if spec.family.mlp == "dense" or dense:
        mlp = f"{hf}mlp."
        yield Rule(
            f"{te}fc1.basic_ops.0.weight",
            ((Part(f"{mlp}gate_proj.weight", ffn), Part(f"{mlp}up_proj.weight", ffn)),),
        )
        yield _one(f"{te}fc2.basic_ops.0.weight", f"{mlp}down_proj.weight", spec.hidden)
        if spec.mlp_bias:
            yield Rule(
                f"{te}fc1.basic_ops.1.bias",
                ((Part(f"{mlp}gate_proj.bias", ffn), Part(f"{mlp}up_proj.bias", ffn)),),
            )
            yield _one(f"{te}fc2.basic_ops.1.bias", f"{mlp}down_proj.bias", spec.hidden)
        return
    if spec.family.mlp == "gpt_oss":
        yield from _gpt_oss_experts(spec, te, f"{hf}mlp.")
        return
    mixtral = spec.architecture == "MixtralForCausalLM"
    hub = f"{hf}block_sparse_moe." if mixtral else f"{hf}mlp."
    fused = f"{hf}mlp."
    gate, up, down = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    yield Rule(
        f"{te}router.weight",
        ((Part(f"{hub}gate.weight", spec.experts),), (Part(f"{fused}gate.weight", spec.experts),)),
    )
    if spec.family.mlp == "glm_moe":
        yield _one(f"{te}router.expert_bias", f"{hub}gate.e_score_correction_bias", spec.experts)
    for e in range(spec.experts):
        expert = f"{hub}experts.{e}."
        yield Rule(
            f"{te}fc1.weight{e}",
            (
                (Part(f"{expert}{gate}.weight", ffn), Part(f"{expert}{up}.weight", ffn)),
                (Part(f"{fused}experts.gate_up_proj", 2 * ffn, e),),
            ),
        )
        yield Rule(
            f"{te}fc2.weight{e}",
            (
                (Part(f"{expert}{down}.weight", spec.hidden),),
                (Part(f"{fused}experts.down_proj", spec.hidden, e),),
            ),
        )
    if spec.family.mlp in ("shared_moe", "glm_moe"):
        # Qwen2-MoE's one gated shared_expert; GLM-4.5's shared_experts (their summed width), ungated
        shared = f"{hf}mlp.shared_expert." if spec.family.mlp == "shared_moe" else f"{hf}mlp.shared_experts."
        yield Rule(
            f"{te}shared_fc1.basic_ops.0.weight",
            (
                (
                    Part(f"{shared}gate_proj.weight", spec.shared_ffn),
                    Part(f"{shared}up_proj.weight", spec.shared_ffn),
                ),
            ),
        )
        yield _one(f"{te}shared_fc2.basic_ops.0.weight", f"{shared}down_proj.weight", spec.hidden)
    if spec.family.mlp == "shared_moe":
        yield _one(f"{te}shared_gate.weight", f"{hf}mlp.shared_expert_gate.weight", 1)


def _gpt_oss_experts(spec: HFSpec, te: str, mlp: str) -> Iterator[Rule]:
    """GPT-OSS's router (with a bias) and experts, stored stacked and transposed (``gate_up_proj``
    ``[experts, hidden, 2 * ffn]``, gate and up columns interleaved; ``down_proj`` ``[experts, ffn,
    hidden]``): each expert's fc1 rows are [gate | up], as ScaledClampedQGeGLU reads them."""
    yield _one(f"{te}router.weight", f"{mlp}router.weight", spec.experts)
    yield _one(f"{te}router.bias", f"{mlp}router.bias", spec.experts)
    ffn, experts = spec.ffn, f"{mlp}experts."
    for e in range(spec.experts):
        for kind, stored, transposed in (
            ("weight", "gate_up_proj", True),
            ("bias", "gate_up_proj_bias", False),
        ):
            halves = tuple(
                Part(f"{experts}{stored}", ffn, e, transposed=transposed, stride=2, offset=o) for o in (0, 1)
            )
            yield Rule(f"{te}fc1.{kind}{e}", (halves,))
        yield Rule(f"{te}fc2.weight{e}", ((Part(f"{experts}down_proj", spec.hidden, e, transposed=True),),))
        yield Rule(f"{te}fc2.bias{e}", ((Part(f"{experts}down_proj_bias", spec.hidden, e),),))


def renamed(rule_list: list[Rule], names: Mapping[str, str]) -> list[Rule]:
    """``rule_list`` with te_assembly step names translated (canonical step -> the model's own)."""
    out = []
    for rule in rule_list:
        step, param = _split_step(rule.te.removeprefix("steps."), names)
        out.append(Rule(f"steps.{names.get(step, step)}.{param}", rule.layouts))
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
    return out


def gather(layout: tuple[Part, ...], source: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The te_assembly tensor ``layout``'s parts make, each read from ``source`` (stacked by rows)."""
    pieces = [p.take(source[p.name] if p.index is None else source[p.name][p.index]) for p in layout]
    return pieces[0].contiguous() if len(pieces) == 1 else torch.cat(pieces, dim=0)


def chosen_layout(rule: Rule, available: set[str] | Mapping[str, object]) -> tuple[Part, ...] | None:
    """The first of the rule's layouts whose tensors all exist, or None."""
    for layout in rule.layouts:
        if all(p.name in available for p in layout):
            return layout
    return None
