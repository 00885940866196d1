"""A Hugging Face ``config.json`` as a ``HFSpec``: every field is honoured or refused, never skipped.

Each family (``families/``) says which fields it reads and reads them; what every family reads alike
(the attention's shape, RoPE, the dtype) and the refusals of fields no family knows are here. A field
that changes the math and that te_assembly cannot express (a RoPE type it does not implement, sliding
windows per layer, an activation other than SiLU...) is an error naming the field, its value and what is
supported; so is a field te_assembly does not know at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from te_assembly.catalog.modules import ROPE_TYPES
from te_assembly.diagnostics import did_you_mean, error
from te_assembly.errors import ConfigError
from te_assembly.files.read import LIMITS, read_json
from te_assembly.formats.hf.families import CHECKED, FAMILIES, KEPT_FIELDS, Family, is_metadata
from te_assembly.formats.hf.families.base import Shape
from te_assembly.formats.hf.reader import ConfigReader, key_lines, located, shown
from te_assembly.formats.hf.spec import HFSpec


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


def parse_config(data: Mapping[str, Any], path: Path, ignore: Sequence[str] = ()) -> HFSpec:
    """The ``HFSpec`` of a ``config.json``; ``HFConfigError`` lists every field it refuses. ``ignore``:
    fields te_assembly does not know that the user accepts knowingly (``import_hf.ignore_fields``)."""
    family = _family(data, path)
    r = ConfigReader(data, path, family.architecture, ignore)
    _known_fields(r, data, family, ignore)
    shape = _attention_shape(r, data, family)
    _supported_values(r, family)
    rope = _rope(r, data, family)
    own = family.read(r, data, shape)
    dtype = _dtype(r, data)
    spec = HFSpec(
        architecture=family.architecture,
        vocab=r.integer("vocab_size"),
        hidden=shape.hidden,
        layers=r.integer("num_hidden_layers"),
        heads=shape.heads,
        kv_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        eps=r.number("rms_norm_eps", 1e-6, becomes=("RMSNorm", "eps")),
        tied=r.flag("tie_word_embeddings", False),
        rope=rope,
        init_std=r.number("initializer_range", 0.02),
        dtype=dtype,
        metadata={k: data[k] for k in KEPT_FIELDS if k in data},
        **own,
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
    raise HFConfigError([located(found, path, key_lines(path), "architectures")])


def known_field(key: str, architecture: str) -> bool:
    """Whether te_assembly reads ``key`` of an ``architecture`` config, holds it to a value, or knows
    it for metadata."""
    return key in FAMILIES[architecture].fields or key in CHECKED or is_metadata(key)


def _known_fields(r: ConfigReader, data: Mapping[str, Any], family: Family, ignore: Sequence[str]) -> None:
    """Every field is one the family honours, holds to a value, is metadata or is ignored by name;
    ``model_type`` is the family's."""
    known = sorted({*family.fields, *CHECKED})
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
        if key in family.droppable:
            continue  # what it describes is left out knowingly (the family reads it so)
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


def _attention_shape(r: ConfigReader, data: Mapping[str, Any], family: Family) -> Shape:
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
    if head_dim % 2 and family.rotary_pairs:  # RoPE turns pairs of features (Attention's rule, at its field)
        field = "head_dim" if data.get("head_dim") is not None else "num_attention_heads"
        r.refuse(
            field,
            f"head_dim {head_dim} is odd: rotary embeddings turn pairs of features",
            code="hf-bad-value",
        )
    if heads % kv_heads:
        message = f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
        r.refuse("num_key_value_heads", message)
    return Shape(hidden, heads, kv_heads, head_dim)


def _supported_values(r: ConfigReader, family: Family) -> None:
    """Fields that change the math, held to the values te_assembly expresses (``CHECKED``, and the
    family's own ``checked``)."""
    held = {k: v for k, v in CHECKED.items() if k not in family.fields}  # a family that reads one: others
    held.update(family.checked)
    for key, (allowed, supported) in held.items():
        r.require(key, allowed, supported)


def _dtype(r: ConfigReader, data: Mapping[str, Any]) -> str:
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


def _same_rope(r: ConfigReader, data: Mapping[str, Any]) -> None:
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


def _rope(r: ConfigReader, data: Mapping[str, Any], family: Family) -> dict[str, Any]:
    """RoPE settings from ``rope_parameters`` (transformers 5) or ``rope_theta`` + ``rope_scaling``."""
    _same_rope(r, data)
    key, params = _rope_params(r, data)
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
    allowed = {"rope_theta", "rope_type", "type", "partial_rotary_factor"} | _scaling(
        r, key, params, data, out
    )
    partial = "partial_rotary_factor" in family.fields  # a family that reads it (GLM-4.5) says so
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


def _rope_params(r: ConfigReader, data: Mapping[str, Any]) -> tuple[str, Any]:
    """Where the RoPE settings are (``rope_parameters``, else ``rope_scaling`` with the top-level
    ``rope_theta``) and what they are; a ``rope_theta`` both inside and at the top must agree."""
    params = data.get("rope_parameters")
    if isinstance(params, Mapping) and "rope_theta" in params and "rope_theta" in data:
        if params["rope_theta"] != data["rope_theta"]:  # transformers reads the one inside
            r.refuse(
                "rope_theta",
                f"rope_theta = {shown(data['rope_theta'])} and rope_parameters.rope_theta = "
                f"{shown(params['rope_theta'])} disagree",
                "keep one of them (transformers 5 writes it inside rope_parameters)",
                code="hf-bad-value",
            )
    if params is not None:
        return "rope_parameters", params
    params = data.get("rope_scaling") or {}
    if isinstance(params, dict):
        params = {**params, **({"rope_theta": data["rope_theta"]} if "rope_theta" in data else {})}
    return "rope_scaling", params


def _scaling(
    r: ConfigReader, key: str, params: Mapping[str, Any], data: Mapping[str, Any], out: dict[str, Any]
) -> set[str]:
    """The scaling's knobs of ``out["rope_type"]`` read into ``out``; the fields it reads."""
    rope_type, allowed = out["rope_type"], set()
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
        allowed |= {*YARN_FIELDS, "factor", "original_max_position_embeddings", "truncate"}
    return allowed


YARN_FIELDS = {
    "beta_fast": "rope_beta_fast",
    "beta_slow": "rope_beta_slow",
    "mscale": "rope_mscale",
    "mscale_all_dim": "rope_mscale_all_dim",
    "attention_factor": "rope_attention_factor",
}
"""YaRN's optional numbers in ``rope_scaling`` and the Attention argument each becomes."""


def _yarn(r: ConfigReader, key: str, params: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Any]:
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


def _original_context(r: ConfigReader, key: str, params: Mapping[str, Any]) -> int:
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


def _positive(r: ConfigReader, key: str, params: Mapping[str, Any], name: str, becomes: str) -> float:
    """``params[name]``: a positive number within the bounds of Attention's argument ``becomes``."""
    return r.checked_number(f"{key}.{name}", params.get(name), becomes=("Attention", becomes))
