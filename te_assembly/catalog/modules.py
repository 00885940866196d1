"""The allowlist of non-fusible torch modules a config may place between fusers.

Configs never import arbitrary Python objects: only names listed here are accepted.
"""

from __future__ import annotations

from te_assembly.catalog.spec import Formula, ModuleSpec, MultipleOf, Param, Width

MODULES: tuple[ModuleSpec, ...] = (
    ModuleSpec("Identity", "torch.nn.Identity: ends the fuser, changes nothing.", "torch.nn:Identity"),
    ModuleSpec(
        "Dropout",
        "torch.nn.Dropout.",
        "torch.nn:Dropout",
        params=(Param("p", float, 0.5, bounds=(0.0, 1.0)),),
    ),
    ModuleSpec("GELU", "torch.nn.GELU (erf).", "torch.nn:GELU"),
    ModuleSpec("ReLU", "torch.nn.ReLU.", "torch.nn:ReLU"),
    ModuleSpec("SiLU", "torch.nn.SiLU.", "torch.nn:SiLU"),
    ModuleSpec("Tanh", "torch.nn.Tanh.", "torch.nn:Tanh"),
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
        ),
        width=Width(in_arg="num_embeddings", out_arg="embedding_dim"),
        param_shapes=lambda a: {"weight": (a["num_embeddings"], a["embedding_dim"])},
        needs_layout="token_ids",
        sets_layout="sequence",
        tie_param="weight",
    ),
    ModuleSpec(
        "LayerNorm",
        "torch.nn.LayerNorm over the last dimension.",
        "torch.nn:LayerNorm",
        params=(Param("normalized_shape", int), Param("eps", float, 1e-5)),
        width=Width(in_arg="normalized_shape"),
        param_shapes=lambda a: {"weight": (a["normalized_shape"],), "bias": (a["normalized_shape"],)},
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
                choices=("default", "linear", "llama3", "yarn"),
                doc="Frequency scaling, as Hugging Face's rope_scaling types: linear divides every "
                "frequency by rope_factor; llama3 divides the low ones and blends the middle band; yarn "
                "interpolates the low ones, keeps the high ones, ramps between, and scales cos and sin.",
            ),
            Param("rope_factor", float, 1.0, bounds=(1e-6, 1e6), doc="linear, llama3 and yarn: the factor."),
            Param("rope_low_freq_factor", float, 1.0, bounds=(1e-6, 1e6), doc="llama3: low_freq_factor."),
            Param("rope_high_freq_factor", float, 4.0, bounds=(1e-6, 1e6), doc="llama3: high_freq_factor."),
            Param(
                "rope_original_max_positions",
                int,
                8192,
                doc="llama3 and yarn: original_max_position_embeddings (the context length it was trained "
                "at).",
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
                doc="yarn: multiplies cos and sin; null: 0.1 ln(factor) + 1, or the mscale ratio.",
            ),
            Param(
                "rope_truncate",
                bool,
                True,
                doc="yarn: round the ramp's ends outwards to whole dimensions (Hugging Face's truncate).",
            ),
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
                "sliding_window",
                (int, type(None)),
                None,
                doc="Causal attention to the last sliding_window positions only (Mistral's window; TE's "
                "window_size=(w - 1, 0)); null: every earlier position.",
            ),
        ),
        param_shapes=lambda a: (
            {"q_norm_weight": (a["head_dim"],), "k_norm_weight": (a["head_dim"],)} if a.get("qk_norm") else {}
        ),
        width=Width(
            in_formula=Formula("(num_heads + 2*num_kv_heads) * head_dim"),
            out_formula=Formula("num_heads * head_dim"),
        ),
        te_class="te_assembly.engines.te.attention:TEAttention",
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
)
