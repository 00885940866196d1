"""Accelerators a config can be checked against before anyone has one: their memory (and compute
capability), by a short name (``h100``). Pure data.

Memory is the datasheet's capacity in decimal gigabytes (what a run can use is a little less: the CUDA
context and the allocator's reserve take some, so leave headroom). Sources, read 2026-11: the "NVIDIA
A100 Tensor Core GPU" datasheet (80 GB HBM2e), "NVIDIA H100 Tensor Core GPU" (SXM, 80 GB HBM3), "NVIDIA
H200 Tensor Core GPU" (141 GB HBM3e), "NVIDIA HGX B200"/"DGX B200" (1,440 GB over 8 GPUs: 180 GB each),
"NVIDIA GB200 NVL72" (up to 13.4 TB HBM3e over 72 GPUs: 186 GB each), "NVIDIA L40S" (48 GB GDDR6).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Accelerator:
    name: str
    memory_bytes: int
    capability: tuple[int, int]
    """CUDA compute capability (major, minor)."""


_GB = 10**9

ACCELERATORS: dict[str, Accelerator] = {
    "a100": Accelerator("A100 80GB", 80 * _GB, (8, 0)),
    "l40s": Accelerator("L40S", 48 * _GB, (8, 9)),
    "h100": Accelerator("H100 SXM", 80 * _GB, (9, 0)),
    "h200": Accelerator("H200", 141 * _GB, (9, 0)),
    "b200": Accelerator("B200", 180 * _GB, (10, 0)),
    "gb200": Accelerator("GB200", 186 * _GB, (10, 0)),
}
"""Short name -> accelerator."""

__all__ = ["ACCELERATORS", "Accelerator"]
