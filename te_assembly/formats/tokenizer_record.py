"""Which tokenizer a model was trained with, as its pretrained directory, run or checkpoint records it,
and the refusal of another: a different tokenizer's ids mean other text to the model."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from te_assembly.data.tokenizer import text_fingerprint
from te_assembly.errors import CheckpointError, ConfigError
from te_assembly.files.read import LIMITS, read_text
from te_assembly.formats.companions import TOKENIZER_FILE
from te_assembly.formats.pretrained import CONFIG_FILE, WEIGHTS_FILE, read_config


def recorded_tokenizer(source: Path) -> str | None:
    """The fingerprint of the tokenizer the model in ``source`` was trained with: a pretrained
    directory's ``config.yaml`` (``tokenizer``), a training run's or checkpoint's run record (its
    data's tokenizer); None where nothing is recorded (a model that is no language model, or one saved
    without its tokenizer)."""
    from te_assembly.formats.checkpoint import newest_good, read_meta, scan

    try:
        if source.is_dir() and (source / CONFIG_FILE).is_file() and (source / WEIGHTS_FILE).is_file():
            value = read_config(source).get("tokenizer")
            return value if isinstance(value, str) else None
        if source.is_dir():
            good, _, _ = newest_good(scan(source))
            meta = read_meta(good.path) if good is not None else {}
        else:
            meta = read_meta(source)
    except (CheckpointError, ConfigError, OSError):
        return None
    run = meta.get("run")
    data = run.get("data") if isinstance(run, Mapping) else None
    value = data.get("tokenizer") if isinstance(data, Mapping) else None
    return value if isinstance(value, str) else None


def _tokenizer_words(fingerprint: str) -> str:
    if fingerprint.startswith("byte-level"):
        return "the byte-level tokenizer (no tokenizer file)"
    if fingerprint.startswith("tokenizers/"):
        return f"a tokenizer.json of fingerprint {fingerprint.removeprefix('tokenizers/')[:12]}"
    return fingerprint


def check_tokenizer(source: Path, tokenizer: Any, what: str) -> None:
    """``DataError`` when ``tokenizer`` (its ``fingerprint``) is not the one the model in ``source`` was
    trained with (``recorded_tokenizer``): another tokenizer's ids mean other text to the model."""
    from te_assembly.errors import DataError

    recorded = recorded_tokenizer(source)
    if recorded is None or recorded == tokenizer.fingerprint:
        return
    given = getattr(tokenizer, "source", None)
    used = (
        f"{given} ({_tokenizer_words(tokenizer.fingerprint)})"
        if given
        else _tokenizer_words(tokenizer.fingerprint)
    )
    raise DataError(
        f"{what}={source} was trained with {_tokenizer_words(recorded)}, not {used}, whose ids would mean "
        f"other text to it: {_tokenizer_fix(source, recorded)}"
    )


def _tokenizer_fix(source: Path, recorded: str) -> str:
    """How to use the tokenizer ``source`` was trained with: none at all (byte-level), the
    ``tokenizer.json`` beside it when that is the one, else where to look."""
    if recorded.startswith("byte-level"):
        return (
            "give it no tokenizer (no generate.tokenizer or data.tokenizer.path, no tokenizer.json beside "
            "the model): byte-level is what it reads"
        )
    folder = source if source.is_dir() else source.parent
    beside = folder / TOKENIZER_FILE
    with contextlib.suppress(Exception):  # unreadable or not a tokenizer: not the one
        if (
            text_fingerprint(read_text(beside, limit=LIMITS["tokenizer"], within=folder), str(beside))
            == recorded
        ):
            return f"use {beside} (generate.tokenizer={beside}, data.tokenizer.path={beside})"
    return (
        "use the tokenizer.json it was trained with (the data.tokenizer.path of its run's config.yaml, or "
        "the one of the model it was imported or started from)"
    )


__all__ = ["check_tokenizer", "recorded_tokenizer"]
