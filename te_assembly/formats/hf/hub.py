"""A Hugging Face Hub name (``ORG/NAME``, ``ORG/NAME@REVISION``) as the local folder of its files, through
``huggingface_hub``: where ``import-hf``, ``verify hf=`` and ``from_hf`` are given one instead of a folder.

The local cache comes first (``HF_HOME``, ``HF_HUB_CACHE``, laid out as huggingface_hub writes it:
``refs``, ``snapshots``, ``blobs``); with ``HF_HUB_OFFLINE=1`` nothing else is tried. Otherwise what the
import needs is downloaded, with huggingface_hub's progress bars: ``IMPORT_FILES`` (the config,
safetensors and their index, the tokenizer files, the generation config, the chat template), never a
pickled ``*.bin`` nor code. A missing, gated or private repository, a revision that is not there and an
offline miss are each one ``CheckpointError`` that says what to do.

A path that exists is always a path: a folder ``ORG/NAME`` where the command runs is read as it is.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from te_assembly.errors import CheckpointError

IMPORT_FILES = [
    "config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
]
"""What an import reads: a checkpoint's files are fetched by these patterns only."""

HUB_NAME = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[\w./-]+))?$")


def is_hub_name(given: str | os.PathLike[str]) -> bool:
    """Whether ``given`` names a Hub repository rather than a folder: ``ORG/NAME[@REVISION]``, and no
    such path exists here."""
    return (
        isinstance(given, str) and HUB_NAME.match(given) is not None and not Path(given).expanduser().exists()
    )


def local_name(given: str | os.PathLike[str]) -> str:
    """The name a folder made from ``given`` takes: a Hub name's ``NAME``, else the folder's own."""
    found = HUB_NAME.match(given) if isinstance(given, str) and is_hub_name(given) else None
    return found.group("repo").split("/")[1] if found else Path(given).expanduser().name


def hub_folder(given: str | os.PathLike[str]) -> Path:
    """The local folder of ``given``: itself when it is a path, a Hub name's snapshot otherwise (module
    docstring)."""
    if not is_hub_name(given):
        return Path(given).expanduser()
    assert isinstance(given, str)
    found = HUB_NAME.match(given)
    assert found is not None
    repo, revision = found.group("repo"), found.group("revision")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    where = f"{repo}{f'@{revision}' if revision else ''}"
    try:
        return Path(
            snapshot_download(repo, revision=revision, allow_patterns=IMPORT_FILES, local_files_only=True)
        )
    except LocalEntryNotFoundError:
        if _offline():
            raise CheckpointError(
                f"{where} is not in the local Hugging Face cache ({_cache()}) and HF_HUB_OFFLINE=1 keeps "
                "te_assembly off the network: run once online, or fetch it with `hf download "
                f"{repo}` where there is a network and copy the cache here"
            ) from None
    return _download(repo, revision, where)


def _download(repo: str, revision: str | None, where: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from huggingface_hub.utils import OfflineModeIsEnabled

    try:
        return Path(snapshot_download(repo, revision=revision, allow_patterns=IMPORT_FILES))
    except GatedRepoError:
        raise CheckpointError(
            f"{where} is gated: accept its terms on its Hub page, then log in (`hf auth login`, or set "
            "HF_TOKEN) and run this again"
        ) from None
    except RepositoryNotFoundError:
        raise CheckpointError(
            f"{where}: no such repository on the Hub (or a private one: log in with `hf auth login` or "
            "HF_TOKEN); a local folder of that name is not here either"
        ) from None
    except RevisionNotFoundError:
        raise CheckpointError(f"{where}: the repository has no revision {revision!r}") from None
    except (LocalEntryNotFoundError, HfHubHTTPError, OfflineModeIsEnabled, OSError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(
            f"{where} is not in the local Hugging Face cache ({_cache()}) and the Hub cannot be reached "
            f"({reason}): run where there is a network, or set HF_HUB_OFFLINE=1 with a populated cache"
        ) from None


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.is_offline_mode())


def _cache() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


__all__ = ["IMPORT_FILES", "hub_folder", "is_hub_name", "local_name"]
