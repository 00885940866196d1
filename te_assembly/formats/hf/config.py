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
    rope = family.read_rope(r, data)
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
        tied=r.flag("tie_word_embeddings", family.tied_by_default),
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
