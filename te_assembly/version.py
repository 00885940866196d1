"""The package version, in one place (the package, run records and config headers read it), and the
fingerprint of the code itself (the ranks of a job compare theirs at start)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

__version__ = "0.1.0"


@functools.cache
def source_sha256() -> str:
    """SHA-256 of te_assembly's own Python source, every module's path and bytes: processes with the
    same one run the same code (a version number says nothing of a checkout's edits)."""
    root = Path(__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()
