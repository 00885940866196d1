"""A Hugging Face ``config.json`` as a ``HFSpec``: every field is honoured or refused, never skipped.

The families and the fields each honours are data (``FAMILIES``, ``HONOURED``), the README's table is
this table. A field that changes the math and that te_assembly cannot express (a RoPE type it does not
implement, sliding windows per layer, an activation other than SiLU...) is an error naming the field,
its value and what is supported; so is a field te_assembly does not know at all.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from te_assembly.catalog import MODULE_ALLOWLIST, OPS
from te_assembly.catalog.modules import ROPE_TYPES
from te_assembly.diagnostics import Diagnostic, did_you_mean, error
from te_assembly.errors import ConfigError
from te_assembly.fields import check_value
from te_assembly.files.read import LIMITS, InputFileError, read_json, read_text
from te_assembly.formats.hf.families import (
    CHECKED,
    FAMILIES,
    FAMILY_CHECKED,
    HONOURED,
    KEPT_FIELDS,
    Family,
    is_metadata,
)


@dataclass(frozen=True)
class HFSpec:
    """A checkpoint's architecture in te_assembly's terms (``layout.py`` writes it as YAML)."""

    architecture: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    eps: float
    tied: bool
    rope: dict[str, Any]
    """``rope_theta``, ``rope_type`` and, for the scaled types, ``factor`` etc. (hf_*_layer's dims)."""
    sliding_window: int | None = None
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    experts: int = 0
    top_k: int = 0
    pre_softmax: bool = False
    aux_loss_coeff: float = 0.0
    shared_ffn: int = 0
    rotary_dim: int | None = None
    """Partial rotary (GLM-4.5's ``partial_rotary_factor * head_dim``); None: the whole head."""
    first_dense: int = 0
    """The first layers with a dense MLP of ``dense_ffn`` (GLM-4.5's ``first_k_dense_replace``)."""
    dense_ffn: int = 0
    mtp_layers: int = 0
    """The multi-token prediction layers ``config.json`` declares after ``layers``
    (``num_nextn_predict_layers``; transformers' default is 1, and it saves none of their tensors)."""
    dropped_layers: int = 0
    """Of those, the ones the import leaves out by request when the checkpoint holds them
    (``import_hf.ignore_fields=[num_nextn_predict_layers]``)."""
    mla: dict[str, Any] = field(default_factory=dict)
    """DeepSeek-V3's latent attention (``LatentAttention``): ``q_lora_rank``, ``kv_lora_rank``,
    ``qk_nope_dim``, ``qk_rope_dim``, ``v_head_dim``, ``rope_interleaved``, ``attention_bias``; empty for
    the families with packed q | k | v heads."""
    layer_windows: tuple[int | None, ...] = ()
    """Each layer's sliding window when they differ (GPT-OSS's ``layer_types``); empty: every layer has
    ``sliding_window``."""
    clamp: dict[str, float] = field(default_factory=dict)
    """GPT-OSS's experts: ``swiglu_limit`` and ``swiglu_alpha``."""
    router: dict[str, Any] = field(default_factory=dict)
    """The family's own TopKRouter arguments beyond experts and top_k (GLM-4.5's sigmoid scores, expert
    bias, groups and scaling), as the router step takes them."""
    init_std: float = 0.02
    dtype: str = "float32"
    metadata: dict[str, Any] = field(default_factory=dict)
    """The checkpoint's own metadata fields (token ids, max_position_embeddings...), kept for export."""

    @property
    def family(self) -> Family:
        return FAMILIES[self.architecture]


class HFConfigError(ConfigError):
    """A ``config.json`` te_assembly cannot express; ``.diagnostics`` names every field at fault."""


DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "float64": "float64"}


def _bad_file(path: str, problem: str, code: str, line: int | None) -> HFConfigError:
    if code == "no-such-file":
        found = error("config.json", "hf-no-config", f"{path} does not exist")
    else:
        found = error("config.json", "hf-bad-config", f"{path}: {problem}")
    return HFConfigError([found.located(path, line)])


def read_config(path: Path, within: Path | None = None) -> dict[str, Any]:
    """``config.json`` as a mapping, read through the shared bounded reader (a regular file of at most
    ``LIMITS["metadata"]`` bytes inside ``within``, UTF-8 JSON with no key twice, nested at most
    ``MAX_JSON_DEPTH`` deep); ``HFConfigError`` for anything else, or a file that is no JSON object."""
    data = read_json(path, limit=LIMITS["metadata"], within=within, make_error=_bad_file)
    if not isinstance(data, dict):
        raise HFConfigError(
            [
                error("config.json", "hf-bad-config", "config.json holds no JSON object").located(
                    str(path), None
                )
            ]
        )
    return data


_KEY = re.compile(r'"((?:[^"\\]|\\.)*)"\s*:')


def key_lines(path: Path) -> dict[str, int]:
    """The line of each key's first appearance in ``path`` (read once; empty when it cannot be read):
    every refusal of a field is located without reading the file again."""
    try:
        text = read_text(path, limit=LIMITS["metadata"])
    except InputFileError:
        return {}
    lines: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        for match in _KEY.finditer(line):
            lines.setdefault(match.group(1), number)
    return lines


def _located(
    diagnostic: Diagnostic, path: Path, lines: Mapping[str, int], key: str | None = None
) -> Diagnostic:
    """``diagnostic`` at ``key``'s line (a nested key, ``rope_scaling.factor``, at its last part's)."""
    line = None
    if key is not None:
        line = lines.get(key) or lines.get(key.split(".")[-1]) or lines.get(key.split(".")[0])
    return diagnostic.located(str(path), line)


def shown(value: Any, width: int = 60) -> str:
    """``repr(value)``, cut to ``width`` characters (a hostile value may be megabytes long)."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


class _Reader:
    """Reads fields of one config, collecting every refusal."""

    def __init__(
        self, data: Mapping[str, Any], path: Path, architecture: str, ignore: Sequence[str] = ()
    ) -> None:
        self.data = data
        self.ignore = set(ignore)
        self.path = path
        self.architecture = architecture
        self.problems: list[Diagnostic] = []
        self.lines = key_lines(path)

    def refuse(self, key: str, message: str, hint: str | None = None, code: str = "hf-unsupported") -> None:
        self.problems.append(
            _located(error(f"config.json:{key}", code, message, hint), self.path, self.lines, key)
        )

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def integer(self, key: str, default: Any = None, minimum: int = 1) -> int:
        value = self.data.get(key, default)
        if value is None or isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.refuse(key, f"{key} = {shown(value)}: expected an integer >= {minimum}", code="hf-bad-value")
            return max(minimum, 1)
        return value

    def number(
        self, key: str, default: Any = None, positive: bool = True, becomes: tuple[str, str] | None = None
    ) -> float:
        """A finite number; ``becomes``: the op argument it turns into (``("RMSNorm", "eps")``), whose
        catalog bounds it must meet too, so an implausible value is refused here, at its own line."""
        return self.checked_number(key, self.data.get(key, default), positive, becomes)

    def checked_number(
        self, key: str, value: Any, positive: bool = True, becomes: tuple[str, str] | None = None
    ) -> float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or (positive and value <= 0):
            self.refuse(
                key,
                f"{key} = {shown(value)}: expected a finite{' positive' if positive else ''} number",
                code="hf-bad-value",
            )
            return 1.0
        if becomes is not None:
            owner, name = becomes
            param = (OPS.get(owner) or MODULE_ALLOWLIST[owner]).param(name)
            assert param is not None, becomes
            found = check_value(param.spec, float(value), f"config.json:{key}", key)
            if found:
                self.refuse(key, f"{found[0].message} ({owner}'s {name})", code="hf-bad-value")
                return float(param.default) if param.default is not None else 1.0
        return float(value)

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.data.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.refuse(key, f"{key} = {shown(value)}: expected true or false", code="hf-bad-value")
            return default
        return value

    def require(self, key: str, allowed: Callable[[Any], bool], supported: str) -> None:
        if key in self.data and not allowed(self.data[key]):
            self.refuse(
                key,
                f"{key} = {shown(self.data[key])} is not supported by te_assembly's {self.architecture} "
                f"import: supported: {supported}",
            )


def parse_config(data: Mapping[str, Any], path: Path, ignore: Sequence[str] = ()) -> HFSpec:
    """The ``HFSpec`` of a ``config.json``; ``HFConfigError`` lists every field it refuses. ``ignore``:
    fields te_assembly does not know that the user accepts knowingly (``import_hf.ignore_fields``)."""
    family = _family(data, path)
    r = _Reader(data, path, family.architecture, ignore)
    _known_fields(r, data, family, ignore)
    hidden, heads, kv_heads, head_dim = _attention_shape(r, data)
    _supported_values(r)
    sliding_window = None
    if family.sliding == "window" and data.get("sliding_window") is not None:
        sliding_window = r.integer("sliding_window")
    rope = _rope(r, data)
    qkv_bias, o_bias = _biases(r, family)
    moe = _experts(r, data, family)
    if family.mlp == "glm_moe":
        moe.update(_glm(r, data, moe, head_dim))
    if family.attention == "mla":
        moe["mla"] = _mla(r, data, heads, kv_heads)
    if family.sliding == "layer_types":
        moe.update(_gpt_oss(r, data))
    dtype = _dtype(r, data)
    spec = HFSpec(
        architecture=family.architecture,
        vocab=r.integer("vocab_size"),
        hidden=hidden,
        layers=r.integer("num_hidden_layers"),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        ffn=r.integer(family.ffn_field),
        eps=r.number("rms_norm_eps", 1e-6, becomes=("RMSNorm", "eps")),
        tied=r.flag("tie_word_embeddings", False),
        rope=rope,
        sliding_window=sliding_window,
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=r.flag("mlp_bias", False) if family.architecture == "LlamaForCausalLM" else False,
        qk_norm=r.flag(family.qk_norm_field, False) if family.qk_norm_field else family.qk_norm,
        init_std=r.number("initializer_range", 0.02),
        dtype=dtype,
        metadata={k: data[k] for k in KEPT_FIELDS if k in data},
        **moe,
    )
    if r.problems:
        raise HFConfigError(r.problems)
    return spec


def _family(data: Mapping[str, Any], path: Path) -> Family:
    architectures = data.get("architectures")
    named = architectures[0] if isinstance(architectures, list) and len(architectures) == 1 else None
    if isinstance(named, str) and named in FAMILIES:
        return FAMILIES[named]
    hint = did_you_mean(named, FAMILIES) if isinstance(named, str) else None
    message = f"architectures = {shown(architectures)}: te_assembly imports one of {', '.join(FAMILIES)}"
    found = error("config.json:architectures", "hf-unknown-architecture", message, hint)
    raise HFConfigError([_located(found, path, key_lines(path), "architectures")])


def known_field(key: str, architecture: str) -> bool:
    """Whether te_assembly reads ``key`` of an ``architecture`` config, holds it to a value, or knows
    it for metadata."""
    return key in HONOURED[architecture] or key in CHECKED or is_metadata(key)


DROPPABLE = ("num_nextn_predict_layers",)
"""Honoured fields ``import_hf.ignore_fields`` may still name: what they describe is left out of the
import on purpose (GLM-4.5's multi-token prediction layers), recorded as ignored."""


def _known_fields(r: _Reader, data: Mapping[str, Any], family: Family, ignore: Sequence[str]) -> None:
    """Every field is one the family honours, holds to a value, is metadata or is ignored by name;
    ``model_type`` is the family's."""
    known = sorted({*HONOURED[family.architecture], *CHECKED})
    for key in data:
        if not known_field(key, family.architecture) and key not in ignore:
            r.refuse(
                key,
                f"{key} = {shown(data[key])}: te_assembly does not know this {family.architecture} field, "
                "so it cannot say the import keeps its meaning",
                did_you_mean(key, known)
                or f"if it has no effect on the model: import_hf.ignore_fields=[{key}] accepts it",
                code="hf-unknown-field",
            )
    for key in ignore:
        if key in DROPPABLE and key in HONOURED[family.architecture]:
            continue  # what it describes is left out knowingly (``_glm``)
        if known_field(key, family.architecture):
            r.refuse(
                key,
                f"import_hf.ignore_fields names {key}, which te_assembly reads: only a field it does not "
                "know can be ignored",
                code="hf-bad-value",
            )
        elif key not in data:
            r.refuse(
                key,
                f"import_hf.ignore_fields names {key}, which config.json does not have",
                did_you_mean(key, sorted(data)),
                code="hf-unknown-field",
            )
    if data.get("model_type") not in (None, family.model_type):
        r.refuse(
            "model_type",
            f"model_type = {shown(data.get('model_type'))} does not match architectures "
            f"{family.architecture} ({family.model_type})",
        )


def _attention_shape(r: _Reader, data: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """hidden size, query heads, key/value heads, head width."""
    hidden = r.integer("hidden_size")
    heads = r.integer("num_attention_heads")
    kv_heads = r.integer("num_key_value_heads", heads)
    if data.get("head_dim") is not None:
        head_dim = r.integer("head_dim")
    elif hidden % heads:
        message = (
            f"hidden_size {hidden} is not a multiple of num_attention_heads {heads} and head_dim is not set"
        )
        r.refuse("num_attention_heads", message)
        head_dim = 1
    else:
        head_dim = hidden // heads
    latent = FAMILIES[r.architecture].attention == "mla"  # its rotary width is qk_rope_head_dim (_mla)
    if head_dim % 2 and not latent:  # RoPE turns pairs of features (Attention's rule, said at its field)
        field = "head_dim" if data.get("head_dim") is not None else "num_attention_heads"
        r.refuse(
            field,
            f"head_dim {head_dim} is odd: rotary embeddings turn pairs of features",
            code="hf-bad-value",
        )
    if heads % kv_heads:
        message = f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
        r.refuse("num_key_value_heads", message)
    return hidden, heads, kv_heads, head_dim


def _supported_values(r: _Reader) -> None:
    """Fields that change the math, held to the values te_assembly expresses (``CHECKED``, and the
    family's own ``FAMILY_CHECKED``)."""
    held = {k: v for k, v in CHECKED.items() if k not in HONOURED[r.architecture]}  # read: other values
    held.update(FAMILY_CHECKED.get(r.architecture, {}))
    for key, (allowed, supported) in held.items():
        r.require(key, allowed, supported)


def _biases(r: _Reader, family: Family) -> tuple[bool, bool]:
    """Whether q/k/v, and o, have biases."""
    if family.qkv_bias == "always":
        return True, False
    if family.qkv_bias == "qkv_bias":
        return r.flag("qkv_bias", True), False
    if family.qkv_bias == "attention_bias":
        both = r.flag("attention_bias", False)
        return both, both
    if family.qkv_bias == "attention_bias_qkv":
        return r.flag("attention_bias", False), False
    return False, False


def _glm(r: _Reader, data: Mapping[str, Any], moe: Mapping[str, Any], head_dim: int) -> dict[str, Any]:
    """GLM-4.5's MoE: sigmoid scores with an expert bias (``e_score_correction_bias``) that chooses but
    does not weigh, group-limited choice (``n_group``, ``topk_group``; a group scored by its best two),
    ``norm_topk_prob``, ``routed_scaling_factor``; ``n_shared_experts`` shared experts as one MLP of
    their summed width beside the routed ones, ungated; the first ``first_k_dense_replace`` layers dense;
    partial rotary."""
    experts = int(moe["experts"])
    default = dict(FAMILIES[r.architecture].moe_defaults)
    groups, kept = r.integer("n_group", default["n_group"]), r.integer("topk_group", default["topk_group"])
    if experts % groups:
        r.refuse("n_group", f"n_group {groups} does not divide the {experts} experts into equal groups")
    if kept > groups:
        r.refuse("topk_group", f"topk_group {kept} is more than the n_group {groups} groups")
    if groups > 1 and experts // groups < 2:
        r.refuse(
            "n_group", f"n_group {groups} leaves groups of one expert: a group is scored by its best two"
        )
    layers = r.integer("num_hidden_layers")
    first_dense = r.integer("first_k_dense_replace", default["first_k_dense_replace"], minimum=0)
    if first_dense >= layers:
        r.refuse(
            "first_k_dense_replace", f"first_k_dense_replace {first_dense} leaves no MoE layer of {layers}"
        )
    mtp = data.get("num_nextn_predict_layers", 0) or 0
    if not isinstance(mtp, int) or isinstance(mtp, bool) or mtp < 0:
        r.refuse("num_nextn_predict_layers", f"num_nextn_predict_layers = {shown(mtp)}", code="hf-bad-value")
        mtp = 0
    # Whether the checkpoint holds those layers is for its tensors to say (``convert._tensor_plan``):
    # transformers declares one by default and saves none.
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
    rotary_dim = None
    if isinstance(factor, (int, float)) and not isinstance(factor, bool) and 0 < factor < 1:
        rotary_dim = int(head_dim * factor)
        if rotary_dim % 2 or rotary_dim <= 0:
            r.refuse(
                "partial_rotary_factor", f"partial_rotary_factor {factor} turns {rotary_dim} features: odd"
            )
    elif factor not in (1, 1.0):
        r.refuse("partial_rotary_factor", f"partial_rotary_factor = {shown(factor)}: expected 0 < f <= 1")
    shared = r.integer("n_shared_experts", default["n_shared_experts"], minimum=1)  # the block has one MLP
    renormalise = r.flag("norm_topk_prob", True)
    scaling = r.number(
        "routed_scaling_factor", default["routed_scaling_factor"], becomes=("TopKRouter", "scaling_factor")
    )
    return {
        "pre_softmax": False,
        "aux_loss_coeff": 0.0,
        "shared_ffn": shared * r.integer("moe_intermediate_size"),
        "rotary_dim": rotary_dim,
        "first_dense": first_dense,
        "dense_ffn": r.integer("intermediate_size"),
        "mtp_layers": mtp,
        "dropped_layers": mtp if "num_nextn_predict_layers" in r.ignore else 0,
        "router": {
            "score_function": "sigmoid",
            "enable_expert_bias": True,
            "num_groups": groups,
            "group_topk": kept,
            "group_score_topk": min(2, experts // groups),
            "scaling_factor": scaling,
            "sigmoid_renormalise": renormalise,
        },
    }


LAYER_TYPES = ("sliding_attention", "full_attention")


def _gpt_oss(r: _Reader, data: Mapping[str, Any]) -> dict[str, Any]:
    """GPT-OSS: each layer's window from ``layer_types`` (transformers' default: sliding, full,
    sliding...), the experts' clamp (``swiglu_limit``, ``swiglu_alpha``)."""
    layers = r.integer("num_hidden_layers")
    window = data.get("sliding_window")
    types = data.get("layer_types")
    if types is None:
        types = ["sliding_attention" if n % 2 == 0 else "full_attention" for n in range(layers)]
    if not isinstance(types, list) or len(types) != layers or any(t not in LAYER_TYPES for t in types):
        r.refuse(
            "layer_types",
            f"layer_types = {shown(types)}: expected {layers} entries, each one of {', '.join(LAYER_TYPES)}",
            code="hf-bad-value",
        )
        types = ["full_attention"] * layers
    if "sliding_attention" in types:
        window = r.integer("sliding_window")
    windows = tuple(window if t == "sliding_attention" else None for t in types)
    # OpenAI's own names, kept in the Hub's config.json beside transformers' (the same numbers)
    given = data.get("rope_parameters") or data.get("rope_scaling")
    rope: Mapping[str, Any] = given if isinstance(given, Mapping) else {}  # _rope refuses any other
    twins = (
        ("experts_per_token", data.get("num_experts_per_tok"), "num_experts_per_tok"),
        ("initial_context_length", rope.get("original_max_position_embeddings"), "YaRN's context"),
    )
    for key, twin, name in twins:
        if key in data and data[key] != twin:
            r.refuse(key, f"{key} = {shown(data[key])} disagrees with {name} ({shown(twin)})")
    clamp = {
        "swiglu_limit": r.number("swiglu_limit", 7.0, becomes=("ScaledClampedQGeGLU", "limit")),
        "swiglu_alpha": r.number("swiglu_alpha", 1.702, becomes=("ScaledClampedQGeGLU", "alpha")),
    }
    return {"layer_windows": windows, "clamp": clamp, "pre_softmax": False}


def _mla(r: _Reader, data: Mapping[str, Any], heads: int, kv_heads: int) -> dict[str, Any]:
    """DeepSeek-V3's multi-head latent attention: queries through ``q_a_proj`` -> norm -> ``q_b_proj``,
    keys and values from a ``kv_lora_rank`` latent and one shared ``qk_rope_head_dim`` rotary key."""
    if data.get("q_lora_rank") is None:
        r.refuse(
            "q_lora_rank",
            "q_lora_rank = null (a plain q_proj, Moonlight's layout): te_assembly's DeepSeek layer takes the "
            "queries through q_a_proj -> q_a_layernorm -> q_b_proj only",
        )
    nope, rope = r.integer("qk_nope_head_dim"), r.integer("qk_rope_head_dim")
    if rope % 2:
        r.refuse("qk_rope_head_dim", f"qk_rope_head_dim {rope}: rotary embeddings turn pairs of features")
    for key, expected in (("qk_head_dim", nope + rope), ("head_dim", rope)):
        if data.get(key) is not None and data[key] != expected:
            r.refuse(key, f"{key} = {shown(data[key])}: DeepSeek-V3 derives it as {expected}")
    if kv_heads != heads:
        r.refuse(
            "num_key_value_heads",
            f"num_key_value_heads {kv_heads} differs from num_attention_heads {heads}: latent attention "
            "expands the latent to every head's own keys and values",
        )
    return {
        "q_lora_rank": r.integer("q_lora_rank") if data.get("q_lora_rank") is not None else 1,
        "kv_lora_rank": r.integer("kv_lora_rank"),
        "qk_nope_dim": nope,
        "qk_rope_dim": rope,
        "v_head_dim": r.integer("v_head_dim"),
        "rope_interleaved": r.flag("rope_interleave", True),
        "attention_bias": r.flag("attention_bias", False),
    }


def _experts(r: _Reader, data: Mapping[str, Any], family: Family) -> dict[str, Any]:
    """A mixture of experts' settings (none for a dense family)."""
    if family.mlp == "dense":
        return {}
    spelt = [k for k in (family.experts_field, *family.experts_aliases) if data.get(k) is not None]
    counts = [r.integer(k) for k in spelt] or [r.integer(family.experts_field)]
    if len(set(counts)) > 1:
        r.refuse(spelt[1], f"{' and '.join(spelt)} disagree ({', '.join(str(data[k]) for k in spelt)})")
    experts = counts[0]
    top_k = r.integer("num_experts_per_tok")
    if top_k > experts:
        r.refuse("num_experts_per_tok", f"num_experts_per_tok {top_k} is more than the {experts} experts")
    renormalise = True if family.norm_topk_field is None else r.flag(family.norm_topk_field, False)
    moe: dict[str, Any] = {
        "experts": experts,
        "top_k": top_k,
        "pre_softmax": not renormalise,
        "aux_loss_coeff": r.number("router_aux_loss_coef", 0.001, positive=False),
    }
    if family.mlp == "shared_moe":
        moe["shared_ffn"] = r.integer("shared_expert_intermediate_size")
    return moe


def _dtype(r: _Reader, data: Mapping[str, Any]) -> str:
    dtype_name = data.get("dtype", data.get("torch_dtype")) or "float32"
    if isinstance(dtype_name, str) and dtype_name in DTYPES:
        return DTYPES[dtype_name]
    message = f"dtype = {shown(dtype_name)}: te_assembly keeps float32, bfloat16, float16 or float64 weights"
    r.refuse("dtype", message)
    return "float32"


def _normal_rope(params: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in params.items() if k != "type"}
    out.setdefault("rope_type", params.get("type", "default"))
    return out


def _same_rope(r: _Reader, data: Mapping[str, Any]) -> None:
    """``rope_parameters`` and ``rope_scaling`` both given: transformers reads ``rope_scaling`` (its
    ``convert_rope_params_to_dict``), te_assembly ``rope_parameters``; they must say the same. A
    ``rope_theta`` or ``partial_rotary_factor`` only one of them has is not a disagreement (transformers
    fills it in from the top level)."""
    params, scaling = data.get("rope_parameters"), data.get("rope_scaling")
    if not scaling or not isinstance(params, Mapping):
        return
    if not isinstance(scaling, Mapping):
        r.refuse("rope_scaling", f"rope_scaling = {shown(scaling)}: expected a mapping", code="hf-bad-value")
        return
    ours, theirs = _normal_rope(params), _normal_rope(scaling)
    filled = ("rope_theta", "partial_rotary_factor")
    differ = sorted(
        k
        for k in set(ours) | set(theirs)
        if ours.get(k) != theirs.get(k) and not (k in filled and (k not in ours or k not in theirs))
    )
    if differ:
        shown_differ = ", ".join(
            f"{k}: {shown(ours.get(k), 20)} / {shown(theirs.get(k), 20)}" for k in differ[:4]
        )
        r.refuse(
            "rope_scaling",
            f"rope_parameters and rope_scaling disagree ({shown_differ}): transformers reads rope_scaling, "
            "te_assembly rope_parameters",
            "keep one of them (transformers 5 writes rope_parameters)",
            code="hf-bad-value",
        )


def _rope(r: _Reader, data: Mapping[str, Any]) -> dict[str, Any]:
    """RoPE settings from ``rope_parameters`` (transformers 5) or ``rope_theta`` + ``rope_scaling``."""
    _same_rope(r, data)
    params = data.get("rope_parameters")
    key = "rope_parameters"
    if isinstance(params, Mapping) and "rope_theta" in params and "rope_theta" in data:
        if params["rope_theta"] != data["rope_theta"]:  # transformers reads the one inside
            r.refuse(
                "rope_theta",
                f"rope_theta = {shown(data['rope_theta'])} and rope_parameters.rope_theta = "
                f"{shown(params['rope_theta'])} disagree",
                "keep one of them (transformers 5 writes it inside rope_parameters)",
                code="hf-bad-value",
            )
    if params is None:
        key = "rope_scaling"
        params = data.get("rope_scaling") or {}
        if isinstance(params, dict):
            params = {**params, **({"rope_theta": data["rope_theta"]} if "rope_theta" in data else {})}
    if not isinstance(params, dict):
        r.refuse(key, f"{key} = {shown(params)}: expected a mapping", code="hf-bad-value")
        return {"rope_theta": 10000.0, "rope_type": "default"}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if not isinstance(rope_type, str) or rope_type not in ROPE_TYPES:
        r.refuse(
            key,
            f"{key}.rope_type = {shown(rope_type)}: te_assembly implements {', '.join(ROPE_TYPES)}",
            did_you_mean(rope_type, ROPE_TYPES) if isinstance(rope_type, str) else None,
        )
        rope_type = "default"
    theta_key = "rope_theta" if "rope_theta" in data else key
    theta = r.checked_number(
        theta_key, params.get("rope_theta", 10000.0), becomes=("Attention", "rotary_base")
    )
    out: dict[str, Any] = {"rope_theta": theta, "rope_type": rope_type}
    allowed = {"rope_theta", "rope_type", "type", "partial_rotary_factor"}
    if rope_type == "yarn":
        allowed.add("truncate")
    if rope_type in ("linear", "llama3"):
        out["rope_factor"] = _positive(r, key, params, "factor", "rope_factor")
        allowed.add("factor")
    if rope_type == "llama3":
        out["rope_low_freq_factor"] = _positive(r, key, params, "low_freq_factor", "rope_low_freq_factor")
        out["rope_high_freq_factor"] = _positive(r, key, params, "high_freq_factor", "rope_high_freq_factor")
        out["rope_original_max_positions"] = _original_context(r, key, params)
        allowed |= {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}
        if out["rope_low_freq_factor"] >= out["rope_high_freq_factor"]:
            r.refuse(key, f"{key}: llama3 needs low_freq_factor < high_freq_factor", code="hf-bad-value")
    if rope_type == "yarn":
        out.update(_yarn(r, key, params, data))
        allowed |= set(YARN_FIELDS) | {"factor", "original_max_position_embeddings"}
    partial = "partial_rotary_factor" in HONOURED[r.architecture]  # GLM-4.5 reads it (``_glm``)
    if not partial and params.get("partial_rotary_factor", 1.0) not in (1, 1.0):
        r.refuse(
            key, f"{key}.partial_rotary_factor = {shown(params['partial_rotary_factor'])}: supported: 1.0"
        )
    for extra in sorted(set(params) - allowed):
        r.refuse(
            key,
            f"{key}.{extra} = {shown(params[extra])}: not read by rope_type {shown(rope_type)}",
            code="hf-unknown-field",
        )
    return out


YARN_FIELDS = {
    "beta_fast": "rope_beta_fast",
    "beta_slow": "rope_beta_slow",
    "mscale": "rope_mscale",
    "mscale_all_dim": "rope_mscale_all_dim",
    "attention_factor": "rope_attention_factor",
}
"""YaRN's optional numbers in ``rope_scaling`` and the Attention argument each becomes."""


def _yarn(r: _Reader, key: str, params: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Any]:
    """YaRN's settings: ``factor`` (or, as transformers reads a config without it, the ratio of
    ``max_position_embeddings`` to ``original_max_position_embeddings``), the original context, the ramp's
    betas, the attention factor's ``mscale``s or its value, ``truncate``."""
    original = _original_context(r, key, params)
    out: dict[str, Any] = {"rope_original_max_positions": original}
    factor = params.get("factor")
    if factor is None and isinstance(data.get("max_position_embeddings"), int):
        factor = data["max_position_embeddings"] / original
    out["rope_factor"] = r.checked_number(f"{key}.factor", factor, becomes=("Attention", "rope_factor"))
    for name, becomes in YARN_FIELDS.items():
        value = params.get(name)
        if value is not None or name in ("beta_fast", "beta_slow"):
            default = {"beta_fast": 32.0, "beta_slow": 1.0}.get(name)
            # transformers reads a 0 or a missing beta as its default (``or 32``)
            given = value or default if name in ("beta_fast", "beta_slow") else value
            out[becomes] = r.checked_number(f"{key}.{name}", given, becomes=("Attention", becomes))
    truncate = params.get("truncate", True)
    if not isinstance(truncate, bool):
        r.refuse(key, f"{key}.truncate = {shown(truncate)}: expected true or false", code="hf-bad-value")
        truncate = True
    out["rope_truncate"] = truncate
    return out


def _original_context(r: _Reader, key: str, params: Mapping[str, Any]) -> int:
    """``original_max_position_embeddings`` of a scaled RoPE (llama3, yarn): a positive integer."""
    original = params.get("original_max_position_embeddings")
    if not isinstance(original, int) or isinstance(original, bool) or original <= 0:
        r.refuse(
            key,
            f"{key}.original_max_position_embeddings = {shown(original)}: expected a positive integer",
            code="hf-bad-value",
        )
        return 8192
    return original


def _positive(r: _Reader, key: str, params: Mapping[str, Any], name: str, becomes: str) -> float:
    """``params[name]``: a positive number within the bounds of Attention's argument ``becomes``."""
    return r.checked_number(f"{key}.{name}", params.get(name), becomes=("Attention", becomes))
