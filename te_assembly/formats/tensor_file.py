"""The one way a safetensors file is opened: through the bounded reader (a regular file, never a FIFO;
inside the folder it was found in, when it was found in one) and then read by safetensors from that
same open file (``/proc/self/fd``), so a file swapped after the check is not the one read. Whatever
safetensors cannot parse (a truncated file, a header that lies) is a ``CheckpointError`` in words.

Training checkpoints (``checkpoint/file.py``), Hugging Face shards (``hf/shards.py``) and PEFT adapters
(``adapters.py``) all open their files here; shards and adapters are written here too (``save_tensors``:
with the user's file mode, where safetensors alone would leave them readable by their owner only).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from te_assembly.errors import CheckpointError
from te_assembly.files.read import ErrorFactory, open_regular
from te_assembly.files.write import file_mode

FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
"""safetensors dtypes a weight may be stored in: an integer or bool tensor where a weight belongs would
be converted to floats of its integer values (``I32`` ids as weights of about 1e9), so it is refused."""

_PROBLEMS = {
    "header too large": "the header claims more bytes than the file holds",
    "incomplete metadata": "its tensors do not cover the file's data exactly",
    "invalid shape, data type, or offset": "a tensor's shape, dtype or data offsets are inconsistent",
    "invalid json in header": "the header is not a JSON object safetensors can read",
}


def as_checkpoint_error(path: str, problem: str, code: str, line: int | None) -> CheckpointError:
    """The bounded reader's refusal of a checkpoint's file (its ``make_error``), as a ``CheckpointError``
    naming the file and, where known, the line."""
    return CheckpointError(f"{path}{f':{line}' if line else ''}: {problem}")


def unreadable(path: Path, exc: Exception, size: int) -> CheckpointError:
    """safetensors' reason ``path`` is not a safetensors file, in words (its size where that helps)."""
    text = str(exc).splitlines()[0] if str(exc) else "unreadable"
    if "header too small" in text.lower():
        return CheckpointError(
            f"{path} is corrupt or truncated: {size} bytes, too short for a safetensors header"
        )
    for key, words in _PROBLEMS.items():
        if key in text.lower():
            return CheckpointError(f"{path} is corrupt or truncated: {words} ({text})")
    return CheckpointError(f"{path} is corrupt or truncated: safetensors cannot read it ({text})")


@contextlib.contextmanager
def open_safetensors(
    path: Path, *, within: Path | None = None, make_error: ErrorFactory | None = None
) -> Iterator[Any]:
    """safetensors' handle on ``path`` (module docstring); ``within``: the folder it was found in, which a
    symlink may not lead out of; ``make_error``: the bounded reader's refusals as the caller words them
    (a ``CheckpointError`` naming the file by default)."""
    from safetensors import SafetensorError, safe_open

    with open_regular(path, limit=None, within=within, make_error=make_error or as_checkpoint_error) as fd:
        size = os.fstat(fd).st_size
        same_file = f"/proc/self/fd/{fd}"
        source = same_file if os.path.exists(same_file) else str(path)
        try:
            opened = safe_open(source, framework="pt", device="cpu")
        except (SafetensorError, OSError, ValueError) as exc:
            raise unreadable(path, exc, size) from None
        with opened as handle:  # errors of the caller's own work are not the file's
            yield handle


def save_tensors(tensors: Mapping[str, Any], path: Path, metadata: Mapping[str, str] | None = None) -> Path:
    """``tensors`` as a safetensors file at ``path``, with the mode any new file of the user gets
    (``0o666`` less the umask): safetensors itself makes its files readable by their owner only."""
    from safetensors.torch import save_file

    save_file(dict(tensors), str(path), metadata=dict(metadata) if metadata is not None else None)
    os.chmod(path, file_mode())
    return path


__all__ = ["FLOAT_DTYPES", "as_checkpoint_error", "open_safetensors", "save_tensors", "unreadable"]
