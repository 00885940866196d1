"""Output directories (``graph.out_dir``, ``train.out_dir``): made and probed before any work, so a path
that cannot take files fails at once with a typed error instead of a traceback after the work is done."""

from __future__ import annotations

import tempfile
from pathlib import Path

from te_assembly.errors import OutputPathError


def prepare_out_dir(path: str | Path) -> Path:
    """Create ``path`` (with parents) and check a file can be written in it; raise ``OutputPathError``."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise OutputPathError(f"cannot write to {out}: it exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        # mkdir can succeed where files cannot be created (read-only mounts, /proc, /sys): write one.
        with tempfile.NamedTemporaryFile(dir=out, prefix=".te_assembly-probe-"):
            pass
    except OSError as exc:
        raise OutputPathError(f"cannot write to {out}: {exc.strerror or exc}") from None
    return out


def write_error(path: Path, exc: OSError) -> OutputPathError:
    """The typed error for a failed write of ``path``."""
    return OutputPathError(f"cannot write to {path}: {exc.strerror or exc}")


__all__ = ["prepare_out_dir", "write_error"]
