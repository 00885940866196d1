"""The attention parts a family is made of: packed q | k | v heads (``Attention``), or DeepSeek's
multi-head latent attention (``LatentAttention``). A family's own twists (which biases it has, q/k
norms, windows) are methods it overrides in its file."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from te_assembly.formats.hf.families.base import Family, Layer, Shape, one
from te_assembly.formats.hf.names import Part, Rule
from te_assembly.formats.hf.reader import shown

if TYPE_CHECKING:
    from te_assembly.formats.hf.reader import ConfigReader
    from te_assembly.formats.hf.spec import HFSpec

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
LONGROPE_DIMS = ("rope_short_factor", "rope_long_factor")
"""LongRoPE's factor lists (Phi-3.5, Phi-4-mini); null in every other model."""
ROPE_DIMS = (
    "rope_theta",
    "rope_type",
    "rope_factor",
    "rope_low_freq_factor",
    "rope_high_freq_factor",
    "rope_original_max_positions",
    *YARN_DIMS,
    *LONGROPE_DIMS,
)
"""The rotary dims every hf_*_layer block takes."""
ROPE_KNOBS = {
    "default": (),
    "linear": ("rope_factor",),
    "llama3": ("rope_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_positions"),
    "yarn": ("rope_factor", "rope_original_max_positions", *YARN_DIMS),
    "longrope": ("rope_factor", "rope_original_max_positions", "rope_attention_factor", *LONGROPE_DIMS),
}
"""The rotary arguments each ``rope_type`` reads."""


def rope_dims(spec: HFSpec) -> dict[str, Any]:
    return rope_dims_of(spec.rope)


def rope_dims_of(rope: Mapping[str, Any]) -> dict[str, Any]:
    """The blocks' rotary dims of a ``HFSpec.rope``."""
    return {
        "rope_theta": rope["rope_theta"],
        "rope_type": rope["rope_type"],
        "rope_factor": rope.get("rope_factor", 1.0),
        "rope_low_freq_factor": rope.get("rope_low_freq_factor", 1.0),
        "rope_high_freq_factor": rope.get("rope_high_freq_factor", 4.0),
        "rope_original_max_positions": rope.get("rope_original_max_positions", 8192),
        **{k: v for k, v in rope.items() if k in YARN_DIMS or k in LONGROPE_DIMS},
    }


def rope_of(attn: Mapping[str, Any]) -> dict[str, Any]:
    """``HFSpec.rope`` of an attention step's arguments."""
    rope = {"rope_theta": float(attn["rotary_base"]), "rope_type": attn["rope_type"]}
    rope.update({knob: attn[knob] for knob in ROPE_KNOBS.get(str(attn["rope_type"]), ())})
    return rope


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


class PackedAttention(Family):
    """q_proj | k_proj | v_proj as one packed Linear, ``Attention`` (grouped-query, rotary), o_proj.
    By default: no biases, no q/k norms, no window; a family overrides what it has."""

    attention_dims_names = ATTENTION_DIMS

    def biases(self, r: ConfigReader) -> tuple[bool, bool]:
        """Whether q/k/v, and o, have biases."""
        return False, False

    def qk_norm(self, r: ConfigReader) -> bool:
        return False

    def window(self, r: ConfigReader, data: Mapping[str, Any]) -> int | None:
        """The sliding window of every layer (None: none)."""
        return None

    def rotary_dim(self, r: ConfigReader, data: Mapping[str, Any], head_dim: int) -> int | None:
        """Partial rotary: the features of each head that turn (None: all)."""
        return None

    def read_attention(self, r: ConfigReader, data: Mapping[str, Any], shape: Shape) -> dict[str, Any]:
        qkv_bias, o_bias = self.biases(r)
        return {
            "qkv_bias": qkv_bias,
            "o_bias": o_bias,
            "qk_norm": self.qk_norm(r),
            "sliding_window": self.window(r, data),
            "rotary_dim": self.rotary_dim(r, data, shape.head_dim),
        }

    def attention_dims(self, spec: HFSpec) -> dict[str, Any]:
        dims: dict[str, Any] = {
            "hidden": spec.hidden,
            "heads": spec.heads,
            "kv_heads": spec.kv_heads,
            "head_dim": spec.head_dim,
            "eps": spec.eps,
            **rope_dims(spec),
            "sliding_window": spec.sliding_window,
            "qk_norm": spec.qk_norm,
            "qkv_bias": spec.qkv_bias,
            "o_bias": spec.o_bias,
        }
        if spec.rotary_dim is not None:
            dims["rotary_dim"] = spec.rotary_dim
        return dims

    def attention_rules(self, spec: HFSpec, te: str, attn: str) -> Iterator[Rule]:
        q, kv = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
        # q_proj | k_proj | v_proj stacked by rows: the packed QKV Linear (and its bias, Qwen2's).
        stacked = (("q_proj", q), ("k_proj", kv), ("v_proj", kv))
        kinds = (("basic_ops.0", "weight"), *((("basic_ops.1", "bias"),) if spec.qkv_bias else ()))
        for op, kind in kinds:
            parts = tuple(Part(f"{attn}{proj}.{kind}", rows) for proj, rows in stacked)
            yield Rule(f"{te}qkv.{op}.{kind}", (parts,))
        if spec.qk_norm:
            yield one(f"{te}attn.q_norm_weight", f"{attn}q_norm.weight", spec.head_dim)
            yield one(f"{te}attn.k_norm_weight", f"{attn}k_norm.weight", spec.head_dim)
        yield one(f"{te}proj.basic_ops.0.weight", f"{attn}o_proj.weight", spec.hidden)
        if spec.o_bias:
            yield one(f"{te}proj.basic_ops.1.bias", f"{attn}o_proj.bias", spec.hidden)

    def has_attention(self, layer: Layer) -> bool:
        return "Attention" in layer.types

    def attention_from_plan(self, layer: Layer) -> dict[str, Any]:
        attn, qkv, proj = layer.args("Attention"), layer.args("Linear", 0), layer.args("Linear", 1)
        return {
            "heads": attn["num_heads"],
            "kv_heads": attn["num_kv_heads"],
            "head_dim": attn["head_dim"],
            "rope": rope_of(attn),
            "sliding_window": attn["sliding_window"],
            "qkv_bias": bool(qkv["bias"]),
            "o_bias": bool(proj["bias"]),
            "qk_norm": bool(attn["qk_norm"]),
            "rotary_dim": attn.get("rotary_dim"),
        }

    @staticmethod
    def features(layer: Layer) -> tuple[bool, bool, bool, bool]:
        """(q/k norms, a sliding window, q/k/v biases, an o bias) of ``layer``'s attention."""
        attn = layer.args("Attention")
        qkv, proj = layer.args("Linear", 0), layer.args("Linear", 1)
        return (
            bool(attn["qk_norm"]),
            attn["sliding_window"] is not None,
            bool(qkv["bias"]),
            bool(proj["bias"]),
        )


def partial_rotary(r: ConfigReader, data: Mapping[str, Any], head_dim: int) -> int | None:
    """``partial_rotary_factor * head_dim`` features turn, where transformers 5 writes the factor
    (inside ``rope_parameters``) or older releases do (at the top)."""
    given = data.get("rope_parameters")
    rope: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
    factor = data.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))
    inner = rope.get("partial_rotary_factor", factor)
    if inner != factor:  # transformers 5 reads the one inside rope_parameters, older releases the other
        r.refuse(
            "partial_rotary_factor",
            f"partial_rotary_factor = {shown(factor)} and rope_parameters.partial_rotary_factor = "
            f"{shown(inner)} disagree",
            "keep one of them (transformers 5 writes it inside rope_parameters)",
            code="hf-bad-value",
        )
    if isinstance(factor, (int, float)) and not isinstance(factor, bool) and 0 < factor < 1:
        rotary_dim = int(head_dim * factor)
        if rotary_dim % 2 or rotary_dim <= 0:
            r.refuse(
                "partial_rotary_factor",
                f"partial_rotary_factor {factor} turns {rotary_dim} features: odd",
            )
        return rotary_dim
    if factor not in (1, 1.0):
        r.refuse("partial_rotary_factor", f"partial_rotary_factor = {shown(factor)}: expected 0 < f <= 1")
    return None


LAYER_TYPES = ("sliding_attention", "full_attention")


def layer_windows(r: ConfigReader, data: Mapping[str, Any], every: int) -> tuple[int | None, ...]:
    """Each layer's sliding window (None: full attention) from ``layer_types``, or, where it is absent,
    transformers' default: every ``every``-th layer full, the others sliding (GPT-OSS and Gemma 2: 2,
    Gemma 3: its ``sliding_window_pattern``); ``sliding_window`` is read when a layer slides."""
    layers = r.integer("num_hidden_layers")
    types = data.get("layer_types")
    if types is None:
        types = ["sliding_attention" if (n + 1) % every else "full_attention" for n in range(layers)]
    if not isinstance(types, list) or len(types) != layers or any(t not in LAYER_TYPES for t in types):
        r.refuse(
            "layer_types",
            f"layer_types = {shown(types)}: expected {layers} entries, each one of " + ", ".join(LAYER_TYPES),
            code="hf-bad-value",
        )
        types = ["full_attention"] * layers
    window = r.integer("sliding_window") if "sliding_attention" in types else None
    return tuple(window if t == "sliding_attention" else None for t in types)


def layer_types_config(spec: HFSpec) -> dict[str, Any]:
    """``layer_types`` and ``sliding_window`` of a model whose layers' windows differ."""
    windows = spec.layer_windows or (spec.sliding_window,) * spec.layers
    return {
        "layer_types": ["full_attention" if w is None else "sliding_attention" for w in windows],
        "sliding_window": next((w for w in windows if w is not None), None),
    }


def windows_of(layers: list[Layer]) -> tuple[int | None, ...]:
    """Each decoder layer's sliding window, read off its attention step."""
    return tuple(group.args("Attention")["sliding_window"] for group in layers)


def rotary_factor(spec: HFSpec) -> float:
    """``partial_rotary_factor`` of ``spec``: the share of each head's features that turn."""
    return (spec.rotary_dim or spec.head_dim) / spec.head_dim


def attention_bias_both(r: ConfigReader) -> tuple[bool, bool]:
    """Llama's ``attention_bias``: q, k, v and o together."""
    both = r.flag("attention_bias", False)
    return both, both


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
MLA_FIELDS = (
    "attention_bias",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "qk_head_dim",
    "v_head_dim",
    "rope_interleave",
)
"""The ``config.json`` fields of latent attention."""
MLA_SIZES = ("q_lora_rank", "kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "v_head_dim")


class LatentAttentionPart(Family):
    """DeepSeek-V2/V3's multi-head latent attention: queries through ``q_a_proj`` -> norm ->
    ``q_b_proj``, keys and values from a ``kv_lora_rank`` latent and one shared ``qk_rope_head_dim``
    rotary key (``LatentAttention``)."""

    attention_dims_names = MLA_DIMS
    attention_linears = 4  # kv_a, q_a, q_b, proj
    rotary_pairs = False  # its rotary width is qk_rope_head_dim, checked here

    def read_attention(self, r: ConfigReader, data: Mapping[str, Any], shape: Shape) -> dict[str, Any]:
        if data.get("q_lora_rank") is None:
            r.refuse(
                "q_lora_rank",
                "q_lora_rank = null (a plain q_proj, Moonlight's layout): te_assembly's DeepSeek layer takes "
                "the queries through q_a_proj -> q_a_layernorm -> q_b_proj only",
            )
        nope, rope = r.integer("qk_nope_head_dim"), r.integer("qk_rope_head_dim")
        if rope % 2:
            r.refuse("qk_rope_head_dim", f"qk_rope_head_dim {rope}: rotary embeddings turn pairs of features")
        for key, expected in (("qk_head_dim", nope + rope), ("head_dim", rope)):
            if data.get(key) is not None and data[key] != expected:
                r.refuse(key, f"{key} = {shown(data[key])}: DeepSeek-V3 derives it as {expected}")
        if shape.kv_heads != shape.heads:
            r.refuse(
                "num_key_value_heads",
                f"num_key_value_heads {shape.kv_heads} differs from num_attention_heads {shape.heads}: "
                "latent attention expands the latent to every head's own keys and values",
            )
        mla = {
            "q_lora_rank": r.integer("q_lora_rank") if data.get("q_lora_rank") is not None else 1,
            "kv_lora_rank": r.integer("kv_lora_rank"),
            "qk_nope_dim": nope,
            "qk_rope_dim": rope,
            "v_head_dim": r.integer("v_head_dim"),
            "rope_interleaved": r.flag("rope_interleave", True),
            "attention_bias": r.flag("attention_bias", False),
        }
        return {"mla": mla}

    def attention_dims(self, spec: HFSpec) -> dict[str, Any]:
        mla = spec.mla
        return {
            "hidden": spec.hidden,
            "heads": spec.heads,
            **{k: mla[k] for k in MLA_SIZES},
            "eps": spec.eps,
            "attention_bias": mla["attention_bias"],
            **rope_dims(spec),
            "rope_interleaved": mla["rope_interleaved"],
        }

    def attention_rules(self, spec: HFSpec, te: str, attn: str) -> Iterator[Rule]:
        """Each projection and norm its own step, the latent's norm and expansion the attention step's
        parameters."""
        mla, bias = spec.mla, spec.mla["attention_bias"]
        q_rows = spec.heads * (mla["qk_nope_dim"] + mla["qk_rope_dim"])
        projections = (
            ("kv_a", "kv_a_proj_with_mqa", mla["kv_lora_rank"] + mla["qk_rope_dim"], bias),
            ("q_a", "q_a_proj", mla["q_lora_rank"], bias),
            ("q_b", "q_b_proj", q_rows, False),
            ("proj", "o_proj", spec.hidden, bias),
        )
        for step, hf, rows, has_bias in projections:
            yield one(f"{te}{step}.basic_ops.0.weight", f"{attn}{hf}.weight", rows)
            if has_bias:
                yield one(f"{te}{step}.basic_ops.1.bias", f"{attn}{hf}.bias", rows)
        yield one(f"{te}q_norm.weight", f"{attn}q_a_layernorm.weight", mla["q_lora_rank"])
        yield one(f"{te}attn.kv_norm_weight", f"{attn}kv_a_layernorm.weight", mla["kv_lora_rank"])
        kv_rows = spec.heads * (mla["qk_nope_dim"] + mla["v_head_dim"])
        yield one(f"{te}attn.kv_b_weight", f"{attn}kv_b_proj.weight", kv_rows)

    def attention_config(self, spec: HFSpec) -> dict[str, Any]:
        mla = spec.mla
        return {
            "attention_bias": mla["attention_bias"],
            "q_lora_rank": mla["q_lora_rank"],
            "kv_lora_rank": mla["kv_lora_rank"],
            "qk_nope_head_dim": mla["qk_nope_dim"],
            "qk_rope_head_dim": mla["qk_rope_dim"],
            "v_head_dim": mla["v_head_dim"],
            "rope_interleave": mla["rope_interleaved"],
        }

    def has_attention(self, layer: Layer) -> bool:
        return "LatentAttention" in layer.types

    def attention_from_plan(self, layer: Layer) -> dict[str, Any]:
        attn = layer.args("LatentAttention")
        q_a, proj = layer.args("Linear", 1), layer.args("Linear", self.attention_linears - 1)
        return {
            "heads": attn["num_heads"],
            "kv_heads": attn["num_heads"],
            "head_dim": attn["qk_rope_dim"],
            "rope": rope_of(attn),
            "mla": {
                "q_lora_rank": q_a["out_features"],
                **{k: attn[k] for k in ("kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "v_head_dim")},
                "rope_interleaved": bool(attn["rope_interleaved"]),
                "attention_bias": bool(proj["bias"]),
            },
        }


__all__ = [
    "ATTENTION_DIMS",
    "LAYER_TYPES",
    "MLA_DIMS",
    "MLA_FIELDS",
    "ROPE_DIMS",
    "ROPE_KNOBS",
    "YARN_DIMS",
    "LatentAttentionPart",
    "PackedAttention",
    "attention_bias_both",
    "layer_types_config",
    "layer_windows",
    "partial_rotary",
    "rope_dims",
    "rope_dims_of",
    "rope_of",
    "rotary_factor",
    "windows_of",
]
