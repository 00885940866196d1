"""The files a model keeps beside its weights, from import through training to export: its tokenizer
(``tokenizer.json`` and the files ``transformers`` reads with it), its generation defaults and the
``config.json`` it was imported from (kept as ``hf_config.json``: context length, special token ids).

They are read through the shared bounded reader from the folder they are found in (a symlink out of it
is refused), and every pointer to remote code (``auto_map``...) is dropped from the JSON ones, so what
te_assembly writes never asks ``transformers`` to run code from elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from te_assembly.files.read import LIMITS, InputFileError, parse_json, read_text
from te_assembly.formats.hf.families import REMOTE_CODE_FIELDS
from te_assembly.formats.tensor_file import as_checkpoint_error

SOURCE_CONFIG = "hf_config.json"
"""An imported checkpoint's own ``config.json``, kept in the pretrained directory for export."""
TOKENIZER_FILE = "tokenizer.json"
GENERATION_CONFIG = "generation_config.json"
COMPANIONS = (
    TOKENIZER_FILE,
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    GENERATION_CONFIG,
    SOURCE_CONFIG,
)
"""Every companion file, as a pretrained directory or a run names it."""
_CLEANED = ("tokenizer_config.json", GENERATION_CONFIG, SOURCE_CONFIG, "config.json")
"""The JSON companions that may name remote code."""


def without_remote_code(data: Any) -> Any:
    """``data`` (a JSON object) without the fields that point at code outside transformers."""
    if not isinstance(data, dict):
        return data
    return {k: v for k, v in data.items() if k not in REMOTE_CODE_FIELDS}


def read_companions(folder: Path, names: Mapping[str, str] | None = None) -> dict[str, str]:
    """The companion files in ``folder`` (``names``: file name there -> name to keep it as; default
    ``COMPANIONS`` as they are), each read through the bounded reader inside ``folder``, the JSON ones
    checked and cleaned of remote code. ``CheckpointError`` for one that cannot be read."""
    wanted = dict(names) if names is not None else {n: n for n in COMPANIONS}
    out: dict[str, str] = {}
    for name, kept in wanted.items():
        path = folder / name
        if not path.exists() and not path.is_symlink():
            continue
        limit = LIMITS["tokenizer"] if name == TOKENIZER_FILE else LIMITS["metadata"]
        text = read_text(path, limit=limit, within=folder, make_error=as_checkpoint_error)
        if name in _CLEANED or kept in _CLEANED:
            data = parse_json(text, str(path), make_error=as_checkpoint_error)
            text = json.dumps(without_remote_code(data), indent=2, ensure_ascii=False) + "\n"
        out[kept] = text
    return out


def companion_json(folder: Path, name: str) -> dict[str, Any] | None:
    """The JSON companion ``name`` (``generation_config.json``, ``hf_config.json``...) in ``folder``,
    read through the bounded reader inside ``folder``; None when there is none or it holds no JSON
    object, ``CheckpointError`` when it cannot be read."""
    path = folder / name
    if not path.exists() and not path.is_symlink():
        return None
    text = read_text(path, limit=LIMITS["metadata"], within=folder, make_error=as_checkpoint_error)
    data = parse_json(text, str(path), make_error=as_checkpoint_error)
    return data if isinstance(data, dict) else None


def source_metadata(folder: Path, fields: tuple[str, ...]) -> dict[str, Any] | None:
    """``fields`` of the ``config.json`` a model was imported from (``hf_config.json`` in ``folder``);
    None when there is none or it cannot be read."""
    try:
        text = read_text(folder / SOURCE_CONFIG, limit=LIMITS["metadata"], within=folder)
        data = parse_json(text, str(folder / SOURCE_CONFIG))
    except InputFileError:
        return None
    if not isinstance(data, dict):
        return None
    return {k: data[k] for k in fields if k in data}


__all__ = [
    "COMPANIONS",
    "GENERATION_CONFIG",
    "SOURCE_CONFIG",
    "TOKENIZER_FILE",
    "read_companions",
    "source_metadata",
    "without_remote_code",
]
