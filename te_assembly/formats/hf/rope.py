"""RoPE as a ``config.json`` gives it: ``rope_parameters`` (transformers 5) or ``rope_theta`` +
``rope_scaling`` (older releases), each scaling type's knobs read into the ``rope_*`` arguments of
te_assembly's attention steps, every knob it does not read refused. A family whose layers turn by more
than one RoPE (Gemma 3's local and global layers) reads each section with ``read_section``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from te_assembly.catalog.modules import ROPE_TYPES
from te_assembly.diagnostics import did_you_mean
from te_assembly.formats.hf.reader import ConfigReader, shown


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


def read_rope(
    r: ConfigReader, data: Mapping[str, Any], partial: bool, aliases: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """RoPE settings from ``rope_parameters`` (transformers 5) or ``rope_theta`` + ``rope_scaling``.
    ``partial``: the family reads ``partial_rotary_factor`` itself (GLM-4.5, Phi-3); ``aliases``: older
    names of a RoPE type the family's config class reads as another (Phi-3's ``su``)."""
    _same_rope(r, data)
    key, params = _rope_params(r, data)
    theta_key = "rope_theta" if "rope_theta" in data else key
    return read_section(r, key, params, data, partial, theta_key, aliases)


def read_section(
    r: ConfigReader,
    key: str,
    params: Any,
    data: Mapping[str, Any],
    partial: bool = False,
    theta_key: str | None = None,
    aliases: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """One RoPE's settings: ``params`` (the mapping at ``key``: its ``rope_type``, ``rope_theta`` and
    the type's knobs) as the attention steps' ``rotary_base`` and ``rope_*`` arguments."""
    if not isinstance(params, dict):
        r.refuse(key, f"{key} = {shown(params)}: expected a mapping", code="hf-bad-value")
        return {"rope_theta": 10000.0, "rope_type": "default"}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if isinstance(rope_type, str):
        rope_type = (aliases or {}).get(rope_type, rope_type)
    if not isinstance(rope_type, str) or rope_type not in ROPE_TYPES:
        r.refuse(
            key,
            f"{key}.rope_type = {shown(rope_type)}: te_assembly implements {', '.join(ROPE_TYPES)}",
            did_you_mean(rope_type, ROPE_TYPES) if isinstance(rope_type, str) else None,
        )
        rope_type = "default"
    theta = r.checked_number(
        theta_key or key, params.get("rope_theta", 10000.0), becomes=("Attention", "rotary_base")
    )
    out: dict[str, Any] = {"rope_theta": theta, "rope_type": rope_type}
    allowed = {"rope_theta", "rope_type", "type", "partial_rotary_factor"} | _scaling(
        r, key, params, data, out
    )
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
    if rope_type == "longrope":
        out.update(_longrope(r, key, params, data))
        allowed |= {"factor", "original_max_position_embeddings", "attention_factor", *LONGROPE_FIELDS}
    return allowed


LONGROPE_FIELDS = {"short_factor": "rope_short_factor", "long_factor": "rope_long_factor"}
"""LongRoPE's factor lists in ``rope_scaling`` and the Attention argument each becomes."""


def _longrope(
    r: ConfigReader, key: str, params: Mapping[str, Any], data: Mapping[str, Any]
) -> dict[str, Any]:
    """LongRoPE's settings as transformers reads them: the original context (in ``rope_scaling``, else
    Phi-3's ``original_max_position_embeddings`` at the top), ``factor`` (else the ratio of
    ``max_position_embeddings`` to it), an optional ``attention_factor``, and the two factor lists (each
    a positive number per rotated pair, as many in both)."""
    original = params.get("original_max_position_embeddings", data.get("original_max_position_embeddings"))
    out: dict[str, Any] = {
        "rope_original_max_positions": _original_context(
            r, key, {"original_max_position_embeddings": original}
        )
    }
    factor = params.get("factor")
    if factor is None and isinstance(data.get("max_position_embeddings"), int):
        factor = data["max_position_embeddings"] / out["rope_original_max_positions"]
    out["rope_factor"] = r.checked_number(f"{key}.factor", factor, becomes=("Attention", "rope_factor"))
    if params.get("attention_factor") is not None:
        out["rope_attention_factor"] = r.checked_number(
            f"{key}.attention_factor",
            params["attention_factor"],
            becomes=("Attention", "rope_attention_factor"),
        )
    lengths = set()
    for name, becomes in LONGROPE_FIELDS.items():
        values = params.get(name)
        if not isinstance(values, list) or not values:
            r.refuse(key, f"{key}.{name} = {shown(values)}: expected a list of numbers", code="hf-bad-value")
            continue
        out[becomes] = [r.checked_number(f"{key}.{name}", v) for v in values]
        lengths.add(len(values))
    if len(lengths) > 1:
        r.refuse(key, f"{key}: short_factor and long_factor differ in length", code="hf-bad-value")
    return out


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


def scaling_of(rope: Mapping[str, Any]) -> dict[str, Any] | None:
    """``rope_scaling`` of a ``HFSpec.rope`` (None: the default RoPE), as ``read_section`` reads it back."""
    if rope["rope_type"] == "default":
        return None
    out: dict[str, Any] = {"rope_type": rope["rope_type"], "factor": rope["rope_factor"]}
    if rope["rope_type"] == "llama3":
        out.update(
            low_freq_factor=rope["rope_low_freq_factor"],
            high_freq_factor=rope["rope_high_freq_factor"],
            original_max_position_embeddings=rope["rope_original_max_positions"],
        )
    if rope["rope_type"] == "longrope":
        out["original_max_position_embeddings"] = rope["rope_original_max_positions"]
        out.update({name: list(rope[dim]) for name, dim in LONGROPE_FIELDS.items()})
        if rope.get("rope_attention_factor") is not None:
            out["attention_factor"] = rope["rope_attention_factor"]
    if rope["rope_type"] == "yarn":
        out["original_max_position_embeddings"] = rope["rope_original_max_positions"]
        for name, dim in YARN_FIELDS.items():
            if rope.get(dim) is not None:
                out[name] = rope[dim]
        if not rope["rope_truncate"]:  # transformers' default is true: written only when it is not
            out["truncate"] = False
    return out


__all__ = ["YARN_FIELDS", "read_rope", "read_section", "scaling_of"]
