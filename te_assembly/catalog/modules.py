"""The allowlist of non-fusible torch modules a config may place between fusers.

Configs never import arbitrary Python objects: only names listed here are accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from te_assembly.catalog.costs import ATTENTION, LATENT_ATTENTION, MOVES, linear
from te_assembly.catalog.spec import Formula, ModuleSpec, MultipleOf, Param, Width

ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")
"""The frequency scalings ``rope_type`` takes (Hugging Face's ``rope_scaling.rope_type`` names)."""

_ROPE: tuple[Param, ...] = (
    Param(
        "rotary_base",
        float,
        10000.0,
        bounds=(1.0, 1e12),
        doc="Base of the rotary frequencies (theta; models use 1e4 to 1e7).",
    ),
    Param(
        "rope_type",
        str,
        "default",
        choices=ROPE_TYPES,
        doc="Frequency scaling, as Hugging Face's rope_scaling types: linear divides every "
        "frequency by rope_factor; llama3 divides the low ones and blends the middle band; yarn "
        "interpolates the low ones, keeps the high ones, ramps between, and scales cos and sin; longrope "
        "(Phi-3.5, Phi-4-mini) divides each frequency by its own factor (rope_short_factor, or "
        "rope_long_factor for a sequence longer than rope_original_max_positions) and scales cos and sin.",
    ),
    Param("rope_factor", float, 1.0, bounds=(1e-6, 1e6), doc="linear, llama3 and yarn: the factor."),
    Param("rope_low_freq_factor", float, 1.0, bounds=(1e-6, 1e6), doc="llama3: low_freq_factor."),
    Param("rope_high_freq_factor", float, 4.0, bounds=(1e-6, 1e6), doc="llama3: high_freq_factor."),
    Param(
        "rope_original_max_positions",
        int,
        8192,
        doc="llama3, yarn and longrope: original_max_position_embeddings (the context length it was "
        "trained at).",
    ),
    Param("rope_beta_fast", float, 32.0, bounds=(1e-6, 1e6), doc="yarn: beta_fast."),
    Param("rope_beta_slow", float, 1.0, bounds=(1e-6, 1e6), doc="yarn: beta_slow."),
    Param(
        "rope_mscale",
        (float, type(None)),
        None,
        bounds=(0.0, 1e3),
        doc="yarn: mscale (with rope_mscale_all_dim: the attention factor's numerator).",
    ),
    Param(
        "rope_mscale_all_dim",
        (float, type(None)),
        None,
        bounds=(0.0, 1e3),
        doc="yarn: mscale_all_dim (the attention factor's denominator).",
    ),
    Param(
        "rope_attention_factor",
        (float, type(None)),
        None,
        bounds=(0.0, 1e3),
        doc="yarn and longrope: multiplies cos and sin; null: yarn's 0.1 ln(factor) + 1 (or the mscale "
        "ratio), longrope's sqrt(1 + ln(factor) / ln(rope_original_max_positions)).",
    ),
    Param(
        "rope_short_factor",
        (list, type(None)),
        None,
        items=float,
        doc="longrope: each rotated frequency pair's divisor up to rope_original_max_positions (one per "
        "pair: rotary_dim / 2 numbers).",
    ),
    Param(
        "rope_long_factor",
        (list, type(None)),
        None,
        items=float,
        doc="longrope: the divisors for a sequence longer than rope_original_max_positions.",
    ),
    Param(
        "rope_truncate",
        bool,
        True,
        doc="yarn: round the ramp's ends outwards to whole dimensions (Hugging Face's truncate).",
    ),
)
"""How the rotary frequencies are made, as Attention and LatentAttention both take them."""


def _qk_norm_shapes(a: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """``qk_norm``'s scales: one per feature of a head, or of all the query (key) heads."""
    if a.get("qk_norm_over", "head") == "projection":
        kv_heads = a.get("num_kv_heads") or a["num_heads"]
        return {
            "q_norm_weight": (a["num_heads"] * a["head_dim"],),
            "k_norm_weight": (kv_heads * a["head_dim"],),
        }
    return {"q_norm_weight": (a["head_dim"],), "k_norm_weight": (a["head_dim"],)}


MODULES: tuple[ModuleSpec, ...] = (
    ModuleSpec(
        "Identity",
        "torch.nn.Identity: ends the fuser, changes nothing.",
        "torch.nn:Identity",
        cost=MOVES,
        token_wise=True,
    ),
    ModuleSpec(
        "Dropout",
        "torch.nn.Dropout.",
        "torch.nn:Dropout",
        params=(Param("p", float, 0.5, bounds=(0.0, 1.0)),),
        token_wise=True,
    ),
    ModuleSpec("GELU", "torch.nn.GELU (erf).", "torch.nn:GELU", token_wise=True),
    ModuleSpec("ReLU", "torch.nn.ReLU.", "torch.nn:ReLU", token_wise=True),
    ModuleSpec("SiLU", "torch.nn.SiLU.", "torch.nn:SiLU", token_wise=True),
    ModuleSpec("Tanh", "torch.nn.Tanh.", "torch.nn:Tanh", token_wise=True),
    ModuleSpec(
        "Linear",
        "torch.nn.Linear.",
        "torch.nn:Linear",
        params=(Param("in_features", int), Param("out_features", int), Param("bias", bool, True)),
        width=Width(in_arg="in_features", out_arg="out_features"),
        param_shapes=lambda a: {
            "weight": (a["out_features"], a["in_features"]),
            **({"bias": (a["out_features"],)} if a.get("bias", True) else {}),
        },
        tie_param="weight",
        cost=linear(),
        token_wise=True,
    ),
    ModuleSpec(
        "Embedding",
        "Token embedding: int64 token ids [batch, seq] -> [batch, seq, embedding_dim], one learned row per "
        "id. A language model's first step (input_layout: token_ids; in_features is the vocabulary size). "
        "TE has no fusible embedding, so it is a module in both engines (it ends a fuser). A vocabulary "
        "head ties its weight to it with tie_weight: <this step>.",
        "te_assembly.engines.reference.embedding:Embedding",
        params=(
            Param("num_embeddings", int, doc="Vocabulary size: ids are 0 .. num_embeddings - 1."),
            Param("embedding_dim", int, doc="Features per token."),
            Param("init_std", float, 0.02, bounds=(0.0, None), doc="Weights start as N(0, init_std^2)."),
            Param(
                "padding_idx",
                (int, type(None)),
                None,
                bounds=(0, None),
                doc="An id whose row gets no gradient and starts at zero (torch.nn.Embedding's padding_idx: "
                "a Hugging Face model's pad_token_id); null: none.",
            ),
        ),
        width=Width(in_arg="num_embeddings", out_arg="embedding_dim"),
        param_shapes=lambda a: {"weight": (a["num_embeddings"], a["embedding_dim"])},
        needs_layout="token_ids",
        sets_layout="sequence",
        tie_param="weight",
        cost=MOVES,  # its backward needs the token ids, counted as the model's input
    ),
    ModuleSpec(
        "LayerNorm",
        "torch.nn.LayerNorm over the last dimension.",
        "torch.nn:LayerNorm",
        params=(Param("normalized_shape", int), Param("eps", float, 1e-5)),
        width=Width(in_arg="normalized_shape"),
        param_shapes=lambda a: {"weight": (a["normalized_shape"],), "bias": (a["normalized_shape"],)},
        token_wise=True,
    ),
    ModuleSpec(
        "Attention",
        "Causal multi-head self-attention on a packed QKV input [batch, seq, (num_heads + 2*num_kv_heads) "
        "* head_dim] laid out [all q heads | all k heads | all v heads]; returns [batch, seq, num_heads * "
        "head_dim]. Grouped-query attention when num_kv_heads < num_heads; rotary position embeddings "
        "(rotate-half, TE's RotaryPositionEmbedding with interleaved=False) on q and k when rotary, with "
        "Hugging Face's default, linear and llama3 frequency scalings; optional per-head RMSNorm of q and k "
        "(qk_norm). No other parameters: the QKV and output projections are the fusible Linear ops around "
        "it. Reference: "
        "torch's scaled_dot_product_attention; TE engine with kernels=te: TE's DotProductAttention "
        "(bshd) and fused RoPE. Runs in the model's dtype, never FP8 (a recipe quantizes the Linears).",
        "te_assembly.engines.reference.attention:Attention",
        params=(
            Param("num_heads", int, doc="Query heads."),
            Param(
                "num_kv_heads",
                (int, type(None)),
                None,
                doc="Key/value heads (grouped-query attention); null: num_heads.",
                default_from="num_heads",
            ),
            Param("head_dim", int, doc="Features per head (q, k and v)."),
            Param("causal", bool, True, doc="Each position attends to itself and earlier positions only."),
            Param("rotary", bool, False, doc="Rotary position embeddings on q and k."),
            *_ROPE,
            Param(
                "rotary_dim",
                (int, type(None)),
                None,
                doc="Partial rotary: only the first rotary_dim features of each q and k head turn (even, "
                "at most head_dim; Hugging Face's partial_rotary_factor * head_dim); null: all of them.",
            ),
            Param(
                "qk_norm",
                bool,
                False,
                doc="RMS-normalise each query and key head over head_dim, with learned scales "
                "q_norm_weight and k_norm_weight, before the rotation (Qwen3).",
            ),
            Param("qk_norm_eps", float, 1e-6, bounds=(0.0, 1.0), doc="qk_norm's epsilon."),
            Param(
                "qk_norm_over",
                str,
                "head",
                choices=("head", "projection"),
                doc="qk_norm over each head's head_dim features (Qwen3), or over all the queries' and all "
                "the keys' features at once, num_heads * head_dim and num_kv_heads * head_dim scales "
                "(OLMo 2's q_norm and k_norm of the whole projection).",
            ),
            Param(
                "sliding_window",
                (int, type(None)),
                None,
                doc="Causal attention to the last sliding_window positions only (Mistral's window; TE's "
                "window_size=(w - 1, 0)); null: every earlier position.",
            ),
            Param(
                "qk_norm_zero_centered",
                bool,
                False,
                doc="qk_norm's scales are stored as offsets from one: the norm multiplies by (1 + w), and "
                "w starts at zero (Gemma 3's q_norm and k_norm; TE RMSNorm's zero_centered_gamma).",
            ),
            Param(
                "softmax_scale",
                (float, type(None)),
                None,
                bounds=(0.0, None),
                doc="What q k^T is multiplied by before the softmax; null: 1 / sqrt(head_dim) (Gemma's "
                "query_pre_attn_scalar ** -0.5).",
            ),
            Param(
                "logit_softcap",
                (float, type(None)),
                None,
                bounds=(1e-6, None),
                doc="Soft-capping of the attention logits, cap * tanh(logits / cap), before the mask and "
                "softmax (Gemma 2's attn_logit_softcapping); null: none. TE's DotProductAttention has no "
                "soft-capping: the TE engine runs such a step with the reference attention.",
            ),
            Param(
                "sinks",
                bool,
                False,
                doc="A learned logit per query head (parameter sinks) that the softmax sees beside the "
                "keys' and drops after, so a query may attend to almost nothing (GPT-OSS's attention "
                "sinks; TE's softmax_type='learnable').",
            ),
        ),
        param_shapes=lambda a: {
            **(_qk_norm_shapes(a) if a.get("qk_norm") else {}),
            **({"sinks": (a["num_heads"],)} if a.get("sinks") else {}),
        },
        width=Width(
            in_formula=Formula("(num_heads + 2*num_kv_heads) * head_dim"),
            out_formula=Formula("num_heads * head_dim"),
        ),
        te_class="te_assembly.engines.te.attention:TEAttention",
        te_lacks=(("logit_softcap", "soft-capping of the attention logits"),),
        cost=ATTENTION,
        te_runs_on_cpu=False,
        multiples=(
            MultipleOf(
                "num_heads",
                "num_kv_heads",
                "each key/value head serves the same number of query heads (grouped-query attention)",
            ),
            MultipleOf("head_dim", 2, "rotary embeddings rotate pairs of features", when="rotary"),
            MultipleOf("rotary_dim", 2, "rotary embeddings rotate pairs of features", when="rotary"),
        ),
        arg_rules=(
            ("rotary_dim", "head_dim", "partial rotary turns some of a head's features, never more"),
            (
                "rope_low_freq_factor",
                "rope_high_freq_factor",
                "llama3 blends frequencies between the low and the high factor",
            ),
        ),
        needs_layout="sequence",
    ),
    ModuleSpec(
        "LatentAttention",
        "Multi-head latent attention (DeepSeek-V2/V3's MLA), causal, on a packed input [batch, seq, "
        "num_heads * (qk_nope_dim + qk_rope_dim) + kv_lora_rank + qk_rope_dim]: the queries (each head "
        "qk_nope_dim features without position, then qk_rope_dim rotated), then the compressed key/value "
        "latent (kv_lora_rank features, RMS-normalised with the learned kv_norm_weight, then expanded by "
        "kv_b_weight to each head's qk_nope_dim key and v_head_dim value features) and one rotated key "
        "of qk_rope_dim features shared by every head. Returns [batch, seq, num_heads * v_head_dim]. "
        "The query and latent projections are the fusible ops before it (a ConcatExtraInput packs them); "
        "the latent's norm and expansion are here because the key/value cache keeps the latent, "
        "kv_lora_rank + qk_rope_dim numbers per position instead of every head's keys and values. "
        "Softmax scale 1 / sqrt(qk_nope_dim + qk_rope_dim), times YaRN's mscale(factor, "
        "rope_mscale_all_dim) squared when rope_type is yarn (DeepSeek-V3's formula). Rotary: as "
        "Attention's rope_type, rotate-half on the qk_rope_dim features (rope_interleaved: pairs of "
        "neighbours instead, DeepSeek's checkpoint layout). Both engines compute it in PyTorch (SDPA).",
        "te_assembly.engines.reference.latent_attention:LatentAttention",
        params=(
            Param("num_heads", int, doc="Query heads (each with its own keys and values)."),
            Param("qk_nope_dim", int, doc="Features of each query and key head without position."),
            Param("qk_rope_dim", int, doc="Rotated features of each query head and of the shared key."),
            Param("v_head_dim", int, doc="Features of each value head (and of each output head)."),
            Param("kv_lora_rank", int, doc="Features of the compressed key/value latent."),
            Param("kv_norm_eps", float, 1e-6, bounds=(0.0, 1.0), doc="The latent's RMSNorm epsilon."),
            Param("causal", bool, True, doc="Each position attends to itself and earlier positions only."),
            *_ROPE,
            Param(
                "rope_interleaved",
                bool,
                False,
                doc="The rotated features come as neighbouring pairs (x0, x1), (x2, x3)... (DeepSeek-V3's "
                "rope_interleave) rather than halves.",
            ),
        ),
        param_shapes=lambda a: {
            "kv_norm_weight": (a["kv_lora_rank"],),
            "kv_b_weight": (a["num_heads"] * (a["qk_nope_dim"] + a["v_head_dim"]), a["kv_lora_rank"]),
        },
        width=Width(
            in_formula=Formula("num_heads * (qk_nope_dim + qk_rope_dim) + kv_lora_rank + qk_rope_dim"),
            out_formula=Formula("num_heads * v_head_dim"),
        ),
        multiples=(MultipleOf("qk_rope_dim", 2, "rotary embeddings rotate pairs of features"),),
        cost=LATENT_ATTENTION,
        arg_rules=(
            (
                "rope_low_freq_factor",
                "rope_high_freq_factor",
                "llama3 blends frequencies between the low and the high factor",
            ),
        ),
        needs_layout="sequence",
    ),
)
