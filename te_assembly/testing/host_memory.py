"""The most host memory a piece of work has in use, looked at after every torch op: glibc's count of what
it has handed out (``mallinfo2``: heap and mmapped blocks), which torch's CPU allocator draws from. What
the memory tests and ``bench/chunked_loss.py`` measure with; unavailable without glibc 2.33+."""

from __future__ import annotations

import ctypes
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _glibc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
    except (OSError, AttributeError):
        return None
    return libc


LIBC = _glibc()
MEASURABLE = LIBC is not None
"""Whether this machine's C library can say what it has handed out."""


def in_use() -> int:
    """Bytes glibc has handed out and not taken back."""
    info = LIBC.mallinfo2()
    return int(info.uordblks + info.hblkhd)


class PeakInUse(TorchDispatchMode):
    """``with PeakInUse() as measured:``: ``measured.peak``, the most bytes in use after any torch op
    inside, above what was in use on entry."""

    def __init__(self) -> None:
        super().__init__()
        self.start, self.peak = in_use(), 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.peak = max(self.peak, in_use() - self.start)
        return out


__all__ = ["MEASURABLE", "PeakInUse", "in_use"]
