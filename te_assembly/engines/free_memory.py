"""How much memory this machine has free for a job: the device's own count, the cgroup's limit, and
``TE_ASSEMBLY_MEMORY_LIMIT``; sizes as people write them (``engines/memory.py`` estimates the need)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from te_assembly.errors import ResourceError


def format_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            return f"{value:,.1f} {unit}" if unit != "B" else f"{n} B"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def _meminfo_available() -> int | None:
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def _cgroup_available() -> int | None:
    """Room left under a cgroup v2 memory limit (containers), if there is one."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit == "max":
            return None
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
    except (OSError, ValueError):
        return None
    return max(0, int(limit) - used)


def available_bytes(device: torch.device) -> tuple[int, str] | None:
    """Free memory on ``device`` and where the number comes from; None when it cannot be known.
    ``TE_ASSEMBLY_MEMORY_LIMIT`` (bytes, or with a unit: ``parse_size``) caps it, e.g. to keep to a
    share of a busy machine; a value that is not a size raises ``ResourceError``."""
    found: list[tuple[int, str]] = []
    if device.type == "cuda":
        if torch.cuda.is_available():
            free, _ = torch.cuda.mem_get_info(device)
            found.append((int(free), f"free on {device} (torch.cuda.mem_get_info)"))
    else:
        meminfo = _meminfo_available()
        if meminfo is not None:
            found.append((meminfo, "MemAvailable in /proc/meminfo"))
        cgroup = _cgroup_available()
        if cgroup is not None:
            found.append((cgroup, "left under the cgroup memory limit"))
        if not found:
            try:
                import psutil  # type: ignore[import-untyped]

                found.append((int(psutil.virtual_memory().available), "available RAM (psutil)"))
            except ImportError:
                pass
    limit = _environment_limit()
    if limit is not None:
        found.append((limit, "TE_ASSEMBLY_MEMORY_LIMIT"))
    return min(found) if found else None


_SIZE = re.compile(r"(\d+(?:\.\d*)?(?:[eE]\d+)?)\s*([A-Za-z]*)")
_UNITS = {"": 1, "b": 1} | {
    f"{prefix}{suffix}": base**power
    for power, prefix in enumerate("kmgtp", start=1)
    for suffix, base in (("b", 1000), ("ib", 1024), ("i", 1024))
}


def parse_size(text: str, what: str) -> int:
    """Bytes from ``text``: a number of bytes (``2000000000``, ``2e9``) or one with a unit, decimal
    (``KB``, ``MB``, ``GB``...) or binary (``KiB``, ``MiB``, ``GiB``...; ``Gi`` as Kubernetes writes
    it), any case. A bare ``G`` is refused: it means 10^9 to some tools and 2^30 to others."""
    match = _SIZE.fullmatch(text.strip())
    if match is not None and match.group(2).lower() in _UNITS:
        number, unit = match.groups()
        return int(float(number) * _UNITS[unit.lower()])
    if match is not None and len(match.group(2)) == 1 and match.group(2).lower() in "kmgtp":
        number, letter = match.group(1), match.group(2).upper()
        raise ResourceError(
            f"{what}={text!r}: {letter!r} alone is ambiguous (a power of 1000 or of 1024): write "
            f"{number}{letter}B or {number}{letter}iB"
        )
    raise ResourceError(
        f"{what}={text!r} is not a size: give bytes (2000000000) or a number with a unit, decimal "
        "(500MB, 2GB) or binary (512MiB, 2GiB)"
    )


def _environment_limit() -> int | None:
    raw = os.environ.get("TE_ASSEMBLY_MEMORY_LIMIT", "").strip()
    return parse_size(raw, "TE_ASSEMBLY_MEMORY_LIMIT") if raw else None


__all__ = ["available_bytes", "format_bytes", "parse_size"]
