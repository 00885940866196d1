"""A ``HFSpec`` as te_assembly YAML, and a te_assembly model's plan back as a ``HFSpec``.

Import writes a model of one of the shipped ``hf_*_layer`` blocks (``configs/block/``) with every
number and flag of the checkpoint as a dim, so the file reads like the ``config.json`` it came from and
a person can edit it. Export goes the other way and is exact: a model is exportable when the spec read
off its steps, written out again, gives the very same steps (types, arguments, channel wiring); the
first step that differs is named. So a model never exports as something it is not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from te_assembly.analysis.plan import Plan, PlannedStep
from te_assembly.errors import ArgumentError
from te_assembly.formats.hf.config import HFSpec

YARN_DIMS = (
    "rope_beta_fast",
    "rope_beta_slow",
    "rope_mscale",
    "rope_mscale_all_dim",
    "rope_attention_factor",
    "rope_truncate",
)
"""YaRN's knobs, as the hf_*_layer blocks' dims (and Attention's arguments) name them; a model that does
not use YaRN leaves them at the blocks' defaults."""

BLOCKS = {
    "dense": "hf_dense_layer",
    "moe": "hf_moe_layer",
    "shared_moe": "hf_shared_moe_layer",
    "glm_moe": "hf_glm_moe_layer",
    "gpt_oss": "hf_gpt_oss_layer",
}
"""The shipped block each kind of MLP uses (with packed q | k | v attention)."""
MLA_BLOCKS = {"dense": "hf_deepseek_dense_layer", "glm_moe": "hf_deepseek_layer"}
"""The shipped blocks with DeepSeek's latent attention."""


def block_of(spec: HFSpec, dense: bool = False) -> str:
    """The shipped block of ``spec``'s layers (``dense``: its first, dense, layers)."""
    kind = "dense" if dense else spec.family.mlp
    return (MLA_BLOCKS if spec.family.attention == "mla" else BLOCKS)[kind]


ROPE_DIMS = (
    "rope_theta",
    "rope_type",
    "rope_factor",
    "rope_low_freq_factor",
    "rope_high_freq_factor",
    "rope_original_max_positions",
    *YARN_DIMS,
)
"""The rotary dims every hf_*_layer block takes."""
ATTENTION_DIMS = (
    "hidden",
    "heads",
    "kv_heads",
    "head_dim",
    "eps",
    *ROPE_DIMS,
    "sliding_window",
    "qk_norm",
    "rotary_dim",
    "qkv_bias",
    "o_bias",
)
"""The dims of a layer's attention (and norms): what dense first layers share with the MoE layers."""
MLA_DIMS = (
    "hidden",
    "heads",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_dim",
    "qk_rope_dim",
    "v_head_dim",
    "eps",
    "attention_bias",
    *ROPE_DIMS,
    "rope_interleaved",
)
"""The same for DeepSeek's latent attention (``hf_deepseek_layer``)."""


def _mlp_kind(spec: HFSpec) -> str:
    return spec.family.mlp


def _rope_dims(spec: HFSpec) -> dict[str, Any]:
    return {
        "rope_theta": spec.rope["rope_theta"],
        "rope_type": spec.rope["rope_type"],
        "rope_factor": spec.rope.get("rope_factor", 1.0),
        "rope_low_freq_factor": spec.rope.get("rope_low_freq_factor", 1.0),
        "rope_high_freq_factor": spec.rope.get("rope_high_freq_factor", 4.0),
        "rope_original_max_positions": spec.rope.get("rope_original_max_positions", 8192),
        **{k: v for k, v in spec.rope.items() if k in YARN_DIMS},
    }


def _attention_dims(spec: HFSpec) -> dict[str, Any]:
    if spec.family.attention == "mla":
        mla = spec.mla
        return {
            "hidden": spec.hidden,
            "heads": spec.heads,
            **{
                k: mla[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "v_head_dim")
            },
            "eps": spec.eps,
            "attention_bias": mla["attention_bias"],
            **_rope_dims(spec),
            "rope_interleaved": mla["rope_interleaved"],
        }
    dims: dict[str, Any] = {
        "hidden": spec.hidden,
        "heads": spec.heads,
        "kv_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
        "eps": spec.eps,
        **_rope_dims(spec),
        "sliding_window": spec.sliding_window,
        "qk_norm": spec.qk_norm,
        "qkv_bias": spec.qkv_bias,
        "o_bias": spec.o_bias,
    }
    if spec.rotary_dim is not None:
        dims["rotary_dim"] = spec.rotary_dim
    return dims


def layer_dims(spec: HFSpec) -> dict[str, Any]:
    """The block's dims for ``spec`` (every one of them, so the model file shows them all)."""
    dims = {**_attention_dims(spec), "ffn": spec.ffn}
    if _mlp_kind(spec) == "glm_moe":
        router = spec.router
        dims.update(
            experts=spec.experts,
            top_k=spec.top_k,
            shared_ffn=spec.shared_ffn,
            n_group=router["num_groups"],
            topk_group=router["group_topk"],
            group_score_topk=router["group_score_topk"],
            routed_scaling_factor=router["scaling_factor"],
            norm_topk_prob=router["sigmoid_renormalise"],
        )
    elif _mlp_kind(spec) == "gpt_oss":
        dims.update(
            sliding_window=next((w for w in spec.layer_windows if w is not None), None),
            experts=spec.experts,
            top_k=spec.top_k,
            aux_loss_coeff=spec.aux_loss_coeff,
            swiglu_limit=spec.clamp["swiglu_limit"],
            swiglu_alpha=spec.clamp["swiglu_alpha"],
        )
    elif _mlp_kind(spec) == "dense":
        dims["mlp_bias"] = spec.mlp_bias
    else:
        dims.update(
            experts=spec.experts,
            top_k=spec.top_k,
            pre_softmax=spec.pre_softmax,
            aux_loss_coeff=spec.aux_loss_coeff,
        )
        if _mlp_kind(spec) == "shared_moe":
            dims["shared_ffn"] = spec.shared_ffn
    return dims


def model_config(spec: HFSpec, name: str, description: str | None = None) -> dict[str, Any]:
    """The te_assembly model (what a ``model/<name>.yaml`` holds) for ``spec``."""
    head: dict[str, Any] = {
        "name": "head",
        "op": "Linear",
        "args": {"in_features": "${model.dims.hidden}", "out_features": "${model.dims.vocab}", "bias": False},
    }
    if spec.tied:
        head["tie_weight"] = "embed"
    layer = layer_dims(spec)
    layers = _layers_step(spec, layer)
    dims: dict[str, Any] = {"vocab": spec.vocab, "layers": spec.layers - spec.first_dense, **layer}
    if "uses" in layers:
        del dims["layers"]  # one use per layer, each with its window
    dense: list[dict[str, Any]] = []
    if spec.first_dense:
        # The first layers are dense (GLM-4.5's first_k_dense_replace): their own block step, before the
        # MoE layers; the Hugging Face layer of layers.N is model.layers.{dense_layers + N}.
        dims = {"vocab": spec.vocab, "dense_layers": spec.first_dense, **dims, "dense_ffn": spec.dense_ffn}
        attention = MLA_DIMS if spec.family.attention == "mla" else ATTENTION_DIMS
        shared = {key: f"${{model.dims.{key}}}" for key in layer if key in attention}
        dense.append(
            {
                "name": "dense_layers",
                "block": block_of(spec, dense=True),
                "repeat": "${model.dims.dense_layers}",
                "dims": {**shared, "ffn": "${model.dims.dense_ffn}", "mlp_bias": False},
            }
        )
    return {
        "name": name,
        "description": description or f"{spec.architecture} as te_assembly blocks ({block_of(spec)}).",
        "in_features": "${model.dims.vocab}",
        "input_layout": "token_ids",
        "dims": dims,
        "ops": [
            {
                "name": "embed",
                "module": "Embedding",
                "args": {
                    "num_embeddings": "${model.dims.vocab}",
                    "embedding_dim": "${model.dims.hidden}",
                    "init_std": spec.init_std,
                },
            },
            *dense,
            layers,
            {
                "name": "final_norm",
                "op": "RMSNorm",
                "args": {"normalized_shape": "${model.dims.hidden}", "eps": "${model.dims.eps}"},
            },
            head,
        ],
    }


def _layers_step(spec: HFSpec, layer: dict[str, Any]) -> dict[str, Any]:
    """The model step of the (MoE or only) layers: ``repeat`` uses alike, or, when the layers' windows
    differ (GPT-OSS's ``layer_types``), one use per layer with its own ``sliding_window``."""
    step: dict[str, Any] = {"name": "layers", "block": block_of(spec)}
    windows = spec.layer_windows
    if len(set(windows)) < 2:
        step["repeat"] = "${model.dims.layers}"
        step["dims"] = {key: f"${{model.dims.{key}}}" for key in layer}
        return step
    step["dims"] = {key: f"${{model.dims.{key}}}" for key in layer if key != "sliding_window"}
    window = "${model.dims.sliding_window}"
    step["uses"] = [{"dims": {"sliding_window": window if w is not None else None}} for w in windows]
    return step


def _args(step: PlannedStep) -> dict[str, Any]:
    return step.spec.with_defaults(step.args)


_ROPE_KNOBS = {
    "default": (),
    "linear": ("rope_factor",),
    "llama3": ("rope_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_positions"),
    "yarn": ("rope_factor", "rope_original_max_positions", *YARN_DIMS),
}


def _effective(step: PlannedStep) -> dict[str, Any]:
    """The arguments that change what the step computes: an Attention's qk_norm_eps without qk_norm,
    or a RoPE knob its rope_type does not read, is left out."""
    args = _args(step)
    if step.type not in ("Attention", "LatentAttention"):
        return args
    unread = {"qk_norm_eps"} if not args.get("qk_norm") else set()
    used = _ROPE_KNOBS.get(str(args.get("rope_type")), ())
    unread |= {k for knobs in _ROPE_KNOBS.values() for k in knobs if k not in used}
    return {k: v for k, v in args.items() if k not in unread}


def _layer_groups(plan: Plan) -> tuple[PlannedStep, list[list[PlannedStep]], PlannedStep]:
    """Embedding, the layers (by ``<use>.<N>.`` prefix), head."""
    steps = list(plan.steps)
    if len(steps) < 4 or steps[0].type != "Embedding":
        raise UnexportableError(plan, steps[0] if steps else None, "the first step must be an Embedding")
    layers: dict[str, list[PlannedStep]] = {}
    for step in steps[1:-2]:
        match = re.match(r"^(.+\.\d+)\.[^.]+$", step.name)
        if match is None:
            raise UnexportableError(
                plan,
                step,
                "between the embedding and the final norm a Hugging Face "
                "model has decoder layers only (block uses, named <use>.<N>.<step>)",
            )
        layers.setdefault(match.group(1), []).append(step)
    if not layers:
        raise UnexportableError(plan, steps[1], "the model has no decoder layers")
    return steps[0], list(layers.values()), steps[-1]


class UnexportableError(ArgumentError):
    """A model with no Hugging Face equivalent; the message names the step that has none."""

    def __init__(self, plan: Plan, step: PlannedStep | None, why: str) -> None:
        where = f"step {step.name!r} ({step.type})" if step is not None else "the model"
        super().__init__(f"{plan.name} has no Hugging Face equivalent: {where}: {why}")
        self.step = step.name if step is not None else None


def spec_of_plan(plan: Plan, metadata: Mapping[str, Any] | None = None) -> HFSpec:
    """The ``HFSpec`` a model's plan expresses (``UnexportableError`` names the first step that no family
    expresses). ``metadata``: an imported checkpoint's own fields, kept (its architecture is used when
    the model still fits it)."""
    embed, layers, head = _layer_groups(plan)
    kinds = [_kind_of(group) for group in layers]
    kind = kinds[-1]
    mla = any(s.type == "LatentAttention" for s in layers[-1])
    attention_linears = 4 if mla else 2  # kv_a, q_a, q_b, proj | qkv, proj
    first_dense = 0
    while kind != "dense" and first_dense < len(kinds) and kinds[first_dense] == "dense":
        first_dense += 1  # GLM-4.5's and DeepSeek-V3's first_k_dense_replace
    dense_ffn = 0
    if first_dense:
        dense_linears = [s for s in layers[0] if s.type == "Linear"]
        dense_ffn = (
            _args(dense_linears[-1])["in_features"] if len(dense_linears) == attention_linears + 2 else 0
        )
    by_type: dict[str, list[PlannedStep]] = {}
    for step in layers[first_dense]:
        by_type.setdefault(step.type, []).append(step)
    try:
        attn = _args(by_type["LatentAttention" if mla else "Attention"][0])
        norm_args = _args(by_type["RMSNorm"][0])
        linears = [_args(s) for s in by_type["Linear"][:attention_linears]]
        mlp_linears = by_type["Linear"][attention_linears:]
        router = _args(by_type["TopKRouter"][0]) if kind != "dense" else {}
        if kind == "dense":
            fc1, fc2 = (_args(s) for s in mlp_linears[:2])
            ffn, mlp_bias = fc2["in_features"], bool(fc1["bias"])
        else:
            fc2 = _args(by_type["GroupedLinear"][1])
            ffn, mlp_bias = fc2["in_features"], False
        shared_ffn = _args(mlp_linears[1])["in_features"] if kind in ("shared_moe", "glm_moe") else 0
    except (KeyError, IndexError, ValueError) as exc:
        raise UnexportableError(
            plan, layers[0][0], f"its layer is not a Hugging Face decoder layer ({exc})"
        ) from None
    glm = kind == "glm_moe"
    embed_args = _args(embed)
    return HFSpec(
        **_attention_fields(kind, attn, linears, metadata),
        vocab=embed_args["num_embeddings"],
        hidden=embed_args["embedding_dim"],
        layers=len(layers),
        ffn=ffn,
        eps=float(norm_args["eps"]),
        tied=head.tie_weight is not None,
        mlp_bias=mlp_bias,
        experts=router.get("num_experts", 0),
        top_k=router.get("top_k", 0),
        pre_softmax=bool(router.get("pre_softmax", False)),
        aux_loss_coeff=float(router.get("aux_loss_coeff", 0.0)),
        shared_ffn=shared_ffn,
        first_dense=first_dense,
        dense_ffn=dense_ffn,
        router={k: router[k] for k in GLM_ROUTER if k in router} if glm else {},
        init_std=float(embed_args["init_std"]),
        metadata=dict(metadata or {}),
        **(_gpt_oss_fields(layers[first_dense], layers) if kind == "gpt_oss" else {}),
    )


def _attention_fields(
    kind: str, attn: dict[str, Any], linears: list[dict[str, Any]], metadata: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The spec's attention: the architecture it implies, heads, rotary, biases (and DeepSeek's latent
    attention, whose ``linears`` are kv_a, q_a, q_b and proj; otherwise qkv and proj)."""
    rope = {"rope_theta": float(attn["rotary_base"]), "rope_type": attn["rope_type"]}
    rope.update({knob: attn[knob] for knob in _ROPE_KNOBS.get(str(attn["rope_type"]), ())})
    if "kv_lora_rank" in attn:
        q_a, proj = linears[1], linears[-1]
        mla = {k: attn[k] for k in ("kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "v_head_dim")}
        return {
            "architecture": "DeepseekV3ForCausalLM",
            "heads": attn["num_heads"],
            "kv_heads": attn["num_heads"],
            "head_dim": attn["qk_rope_dim"],
            "rope": rope,
            "mla": {
                "q_lora_rank": q_a["out_features"],
                **mla,
                "rope_interleaved": bool(attn["rope_interleaved"]),
                "attention_bias": bool(proj["bias"]),
            },
        }
    qkv, proj = linears
    qk_norm, qkv_bias, o_bias = bool(attn["qk_norm"]), bool(qkv["bias"]), bool(proj["bias"])
    return {
        "architecture": _architecture(kind, qk_norm, qkv_bias, o_bias, attn["sliding_window"], metadata),
        "heads": attn["num_heads"],
        "kv_heads": attn["num_kv_heads"],
        "head_dim": attn["head_dim"],
        "rope": rope,
        "sliding_window": None if kind == "gpt_oss" else attn["sliding_window"],
        "qkv_bias": qkv_bias,
        "o_bias": o_bias,
        "qk_norm": qk_norm,
        "rotary_dim": attn.get("rotary_dim"),
    }


def _gpt_oss_fields(layer: list[PlannedStep], layers: list[list[PlannedStep]]) -> dict[str, Any]:
    """GPT-OSS's spec fields: each layer's window, the experts' clamp."""
    act = next(_args(s) for s in layer if s.type == "ScaledClampedQGeGLU")
    windows = tuple(
        next(_args(s) for s in group if s.type == "Attention")["sliding_window"] for group in layers
    )
    return {
        "layer_windows": windows,
        "clamp": {"swiglu_limit": act["limit"], "swiglu_alpha": act["alpha"]},
    }


GLM_ROUTER = (
    "score_function",
    "enable_expert_bias",
    "num_groups",
    "group_topk",
    "group_score_topk",
    "scaling_factor",
    "sigmoid_renormalise",
)
"""The router arguments a GLM-4.5 layer sets (``HFSpec.router``)."""


def _kind_of(layer: list[PlannedStep]) -> str:
    """The MLP kind of one decoder layer's steps (``BLOCKS``'s keys)."""
    types = {s.type for s in layer}
    if "SigmoidGate" in types:
        return "shared_moe"
    if "ScaledClampedQGeGLU" in types:
        return "gpt_oss"
    if "TopKRouter" in types:
        router = next(_args(s) for s in layer if s.type == "TopKRouter")
        shared = sum(s.type == "Linear" for s in layer) > (4 if "LatentAttention" in types else 2)
        return "glm_moe" if router["score_function"] == "sigmoid" and shared else "moe"
    return "dense"


def _architecture(
    kind: str,
    qk_norm: bool,
    qkv_bias: bool,
    o_bias: bool,
    window: int | None,
    metadata: Mapping[str, Any] | None,
) -> str:
    """The family whose features these are (the imported one when it still fits); whether it expresses
    everything else is for ``check_same_steps`` to say."""
    candidates: list[str] = []
    if kind == "glm_moe":
        candidates = ["Glm4MoeForCausalLM"]
    elif kind == "gpt_oss":
        candidates = ["GptOssForCausalLM"]
    elif kind == "shared_moe":
        candidates = ["Qwen2MoeForCausalLM"]
    elif kind == "moe":
        candidates = ["Qwen3MoeForCausalLM"] if qk_norm else ["MixtralForCausalLM"]
    elif qk_norm:
        candidates = ["Qwen3ForCausalLM"]
    elif window is not None:
        candidates = ["MistralForCausalLM"]
    elif qkv_bias and not o_bias:
        candidates = ["Qwen2ForCausalLM"]
    else:
        candidates = ["LlamaForCausalLM", "MistralForCausalLM"]
    wanted = (metadata or {}).get("architectures")
    if isinstance(wanted, list) and wanted and wanted[0] in candidates:
        return str(wanted[0])
    return candidates[0]


def check_same_steps(plan: Plan, rebuilt: Plan, architecture: str) -> dict[str, str]:
    """``UnexportableError`` unless ``rebuilt`` (the spec of ``plan`` written out again) has ``plan``'s
    steps one for one: type, every argument, the wiring of every channel (by producer position) and
    ties. Returns rebuilt step name -> ``plan``'s step name."""
    mine, theirs = list(plan.steps), list(rebuilt.steps)
    what = f"{architecture} of this size"
    for index in range(max(len(mine), len(theirs))):
        if index >= len(mine) or index >= len(theirs):
            step = mine[index] if index < len(mine) else mine[-1]
            raise UnexportableError(plan, step, f"a {what} has {len(theirs)} steps, this model {len(mine)}")
        a, b = mine[index], theirs[index]
        if a.type != b.type or a.kind != b.kind:
            raise UnexportableError(plan, a, f"a {what} has a {b.type} here")
        args_a, args_b = _effective(a), _effective(b)
        for key in sorted(set(args_a) | set(args_b)):
            if args_a.get(key) != args_b.get(key):
                raise UnexportableError(
                    plan, a, f"{key}={args_a.get(key)!r} where a {what} has {key}={args_b.get(key)!r}"
                )
    names = {b.name: a.name for a, b in zip(mine, theirs, strict=True)}
    for index, (wa, wb) in enumerate(zip(_wiring(plan), _wiring(rebuilt), strict=True)):
        if wa != wb:
            raise UnexportableError(plan, mine[index], f"its channels are wired unlike a {what}'s")
    if [(s.tie_weight is None) for s in mine] != [(s.tie_weight is None) for s in theirs]:
        raise UnexportableError(plan, mine[-1], f"its weight ties differ from a {what}'s")
    return names


def _wiring(plan: Plan) -> list[tuple[Any, ...]]:
    """Each step's inputs as (slot, producer step position, producer slot, public) and outputs' publicity."""
    producer: dict[str, tuple[int, int]] = {}
    for step in plan.steps:
        for slot, channel in enumerate(step.output_channels):
            if channel is not None:
                producer[channel] = (step.index, slot)
    out = []
    for step in plan.steps:
        inputs = tuple(producer.get(c) if c is not None else None for c in step.input_channels)
        out.append((inputs, tuple(step.output_public)))
    return out
